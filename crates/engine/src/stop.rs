//! Stop strings over streamed text.
//!
//! Contract: text arrives in pieces (one per token); [`StopText::push`]
//! returns what may be streamed now. A stop string may span pieces, so a
//! suffix of the output that is a prefix of some stop string is held back
//! until it either completes the stop (then the output ends just before it)
//! or can no longer become one (then it is released). Streamed text
//! concatenated always equals [`StopText::text`] once finished.
//!
//! Matching runs one Knuth-Morris-Pratt automaton per stop string over the
//! output's bytes: its state is the longest suffix of the output that is a
//! prefix of the stop string, which is both the match test (the whole
//! string) and the hold-back (the longest state of all). Stop strings and
//! output are UTF-8, so a match or a held-back suffix always starts on a
//! character boundary (it starts with the stop string's first byte).
//!
//! Cost: O(Σ stop lengths) time and 4 bytes per stop byte at
//! [`StopText::new`]; per push O(piece x number of stops) amortised over
//! the output, never a function of the stop strings' lengths (periodic
//! stop strings cost no more than any others).

/// Result of adding one piece of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Not stopped; stream this (possibly empty) delta.
    Continue(String),
    /// A stop string completed; stream this last delta and finish.
    Stop(String),
}

/// One stop string and its matching automaton.
#[derive(Debug, Clone)]
struct Matcher {
    stop: Box<[u8]>,
    /// `fail[i]`: the longest proper prefix of `stop[..=i]` that is also
    /// its suffix (the KMP failure function).
    fail: Box<[u32]>,
    /// Bytes of `stop` the output currently ends with.
    state: usize,
}

impl Matcher {
    fn new(stop: &str) -> Matcher {
        let stop = stop.as_bytes();
        let mut fail = vec![0u32; stop.len()];
        let mut k = 0usize;
        for i in 1..stop.len() {
            while k > 0 && stop[i] != stop[k] {
                k = fail[k - 1] as usize;
            }
            if stop[i] == stop[k] {
                k += 1;
            }
            fail[i] = k as u32;
        }
        Matcher {
            stop: stop.into(),
            fail: fail.into(),
            state: 0,
        }
    }

    /// Advances past `b`; true when the stop string has just completed.
    fn step(&mut self, b: u8) -> bool {
        if self.state == self.stop.len() {
            self.state = self.fail[self.state - 1] as usize;
        }
        while self.state > 0 && self.stop[self.state] != b {
            self.state = self.fail[self.state - 1] as usize;
        }
        if self.stop[self.state] == b {
            self.state += 1;
        }
        self.state == self.stop.len()
    }
}

/// Output text with stop-string detection and hold-back.
#[derive(Debug, Clone, Default)]
pub(crate) struct StopText {
    stops: Vec<Matcher>,
    text: String,
    /// Bytes of `text` already streamed.
    emitted: usize,
}

impl StopText {
    /// Empty stop strings are ignored.
    pub(crate) fn new(stops: &[String]) -> Self {
        StopText {
            stops: stops
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| Matcher::new(s))
                .collect(),
            text: String::new(),
            emitted: 0,
        }
    }

    /// Appends `piece`; returns what can be streamed.
    pub(crate) fn push(&mut self, piece: &str) -> Pushed {
        let old_len = self.text.len();
        self.text.push_str(piece);
        if self.stops.is_empty() {
            return Pushed::Continue(self.take_to(self.text.len()));
        }
        // the earliest-starting stop string completed within `piece`
        let mut hit: Option<usize> = None;
        for m in &mut self.stops {
            for (i, &b) in piece.as_bytes().iter().enumerate() {
                if m.step(b) {
                    let start = old_len + i + 1 - m.stop.len();
                    hit = Some(hit.map_or(start, |h| h.min(start)));
                    break;
                }
            }
        }
        if let Some(pos) = hit {
            let delta = self.take_to(pos);
            self.text.truncate(pos.max(self.emitted));
            return Pushed::Stop(delta);
        }
        let hold = self.stops.iter().map(|m| m.state).max().unwrap_or(0);
        Pushed::Continue(self.take_to(self.text.len() - hold))
    }

    /// Whether pushed text is held back (it could still become a stop string).
    pub(crate) fn holding(&self) -> bool {
        self.text.len() > self.emitted
    }

    /// Releases the held-back text at the end of generation.
    pub(crate) fn flush(&mut self) -> String {
        self.take_to(self.text.len())
    }

    /// All output text so far (ending before a stop string that was hit).
    #[cfg(test)]
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    fn take_to(&mut self, end: usize) -> String {
        if end <= self.emitted {
            return String::new();
        }
        let delta = self.text[self.emitted..end].to_string();
        self.emitted = end;
        delta
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<Pushed>, String) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut st = StopText::new(&stops);
        let mut out = Vec::new();
        for p in pieces {
            let r = st.push(p);
            let stop = matches!(r, Pushed::Stop(_));
            out.push(r);
            if stop {
                return (out, st.text().to_string());
            }
        }
        out.push(Pushed::Continue(st.flush()));
        (out, st.text().to_string())
    }

    fn streamed(r: &[Pushed]) -> String {
        r.iter()
            .map(|p| match p {
                Pushed::Continue(s) | Pushed::Stop(s) => s.as_str(),
            })
            .collect()
    }

    #[test]
    fn no_stops_streams_everything() {
        let (r, text) = run(&[], &["ab", "c"]);
        assert_eq!(r[0], Pushed::Continue("ab".into()));
        assert_eq!(text, "abc");
    }

    #[test]
    fn stop_spanning_pieces_is_held_back_then_cut() {
        let (r, text) = run(&["END"], &["hello E", "N", "D tail"]);
        assert_eq!(r[0], Pushed::Continue("hello ".into()));
        assert_eq!(r[1], Pushed::Continue(String::new()));
        assert_eq!(r[2], Pushed::Stop(String::new()));
        assert_eq!(text, "hello ");
        assert_eq!(streamed(&r), text);
    }

    #[test]
    fn false_start_is_released() {
        let (r, text) = run(&["END"], &["a E", "Nx", "y"]);
        assert_eq!(r[0], Pushed::Continue("a ".into()));
        assert_eq!(r[1], Pushed::Continue("ENx".into()));
        assert_eq!(text, "a ENxy");
        assert_eq!(streamed(&r), text);
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let (r, text) = run(&["xyz", "b"], &["aaxy", "zb"]);
        assert!(matches!(r.last(), Some(Pushed::Stop(_))));
        assert_eq!(text, "aa");
        assert_eq!(streamed(&r), "aa");
    }

    #[test]
    fn stop_inside_one_piece_and_multibyte() {
        let (r, text) = run(&["é!"], &["ab", "cé", "!d"]);
        assert_eq!(text, "abc");
        assert_eq!(streamed(&r), "abc");
        assert!(matches!(r[2], Pushed::Stop(_)));
    }

    #[test]
    fn holding_while_text_could_still_become_a_stop() {
        let mut st = StopText::new(&["END".to_string()]);
        st.push("a E");
        assert!(st.holding());
        st.push("x");
        assert!(!st.holding());
        st.push("");
        assert!(!st.holding());
    }

    #[test]
    fn held_text_is_flushed_at_the_end() {
        let (r, text) = run(&["STOP"], &["go ST"]);
        assert_eq!(r[0], Pushed::Continue("go ".into()));
        assert_eq!(r[1], Pushed::Continue("ST".into()));
        assert_eq!(text, "go ST");
    }

    /// The reference semantics, by brute force over the whole text: the
    /// earliest-starting occurrence of any stop ends the output; otherwise
    /// the longest suffix that is a proper prefix of a stop is held back.
    fn reference(stops: &[&str], pieces: &[&str]) -> (String, String, bool) {
        let mut text = String::new();
        let mut streamed = String::new();
        for p in pieces {
            text.push_str(p);
            if let Some(pos) = stops.iter().filter_map(|s| text.find(s)).min() {
                text.truncate(pos.max(streamed.len()));
                streamed = text.clone();
                return (text, streamed, true);
            }
            let hold = stops
                .iter()
                .flat_map(|s| {
                    (1..s.len()).filter(|&k| text.as_bytes().ends_with(&s.as_bytes()[..k]))
                })
                .max()
                .unwrap_or(0);
            if text.len() - hold > streamed.len() {
                streamed = text[..text.len() - hold].to_string();
            }
        }
        (text.clone(), text, false)
    }

    /// Random stops and pieces over a small alphabet (so prefixes overlap
    /// often) match the brute-force reference.
    #[test]
    fn matches_the_reference_on_random_text() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n) as usize
        };
        let alphabet = ["a", "b", "é", "ab"];
        for _ in 0..2_000 {
            let word = |next: &mut dyn FnMut(u64) -> usize, len: usize| -> String {
                (0..len).map(|_| alphabet[next(4)]).collect()
            };
            let mut stops = Vec::new();
            for _ in 0..1 + next(3) {
                let len = 1 + next(4);
                stops.push(word(&mut next, len));
            }
            let mut pieces = Vec::new();
            for _ in 0..next(8) {
                let len = next(3);
                pieces.push(word(&mut next, len));
            }
            let stop_refs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let piece_refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (r, text) = run(&stop_refs, &piece_refs);
            let (want_text, want_streamed, stopped) = reference(&stop_refs, &piece_refs);
            let case = format!("{stops:?} {pieces:?}");
            assert_eq!(text, want_text, "{case}");
            assert_eq!(streamed(&r), want_streamed, "{case}");
            assert_eq!(matches!(r.last(), Some(Pushed::Stop(_))), stopped, "{case}");
        }
    }

    /// Time per pushed byte does not grow with the stop strings' length,
    /// periodic ones included (output running into their repeated byte).
    #[test]
    fn cost_is_independent_of_stop_length() {
        // the best of three runs: a preempted run says nothing about cost
        let per_byte =
            |len: usize| -> f64 { (0..3).map(|_| once(len)).fold(f64::INFINITY, f64::min) };
        fn once(len: usize) -> f64 {
            let stops: Vec<String> = (0..4)
                .map(|i| format!("{}{}", "a".repeat(len), (b'b' + i) as char))
                .collect();
            let mut st = StopText::new(&stops);
            let t0 = std::time::Instant::now();
            let pushes = 4_000;
            for _ in 0..pushes {
                assert!(matches!(st.push("a"), Pushed::Continue(_)));
            }
            t0.elapsed().as_secs_f64() / pushes as f64
        }
        let small = per_byte(64).max(1e-8);
        for len in [1 << 12, 1 << 16, 1 << 20] {
            let big = per_byte(len);
            assert!(
                big < small * 50.0,
                "stops of {len} bytes: {big:e} s per byte vs {small:e} for 64"
            );
        }
    }
}
