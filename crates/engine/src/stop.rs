//! Stop strings over streamed text.
//!
//! Contract: text arrives in pieces (one per token); [`StopText::push`]
//! returns what may be streamed now. A stop string may span pieces, so a
//! suffix of the output that is a prefix of some stop string is held back
//! until it either completes the stop (then the output ends just before it)
//! or can no longer become one (then it is released). Streamed text
//! concatenated always equals [`StopText::text`] once finished.
//!
//! Cost per push: O(piece + Σ stop lengths²) (a search over the last
//! `max_stop_len - 1 + piece` bytes and the hold-back scan); independent of the
//! output length.

/// Result of adding one piece of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Not stopped; stream this (possibly empty) delta.
    Continue(String),
    /// A stop string completed; stream this last delta and finish.
    Stop(String),
}

/// Output text with stop-string detection and hold-back.
#[derive(Debug, Clone, Default)]
pub(crate) struct StopText {
    stops: Vec<String>,
    max_len: usize,
    text: String,
    /// Bytes of `text` already streamed.
    emitted: usize,
}

impl StopText {
    /// Empty stop strings are ignored.
    pub(crate) fn new(stops: &[String]) -> Self {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let max_len = stops.iter().map(String::len).max().unwrap_or(0);
        StopText {
            stops,
            max_len,
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
        // a new occurrence must end inside `piece`, so it starts at most
        // max_len - 1 bytes before it
        let mut from = old_len.saturating_sub(self.max_len - 1);
        while !self.text.is_char_boundary(from) {
            from -= 1;
        }
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.text[from..].find(s.as_str()).map(|i| from + i))
            .min();
        if let Some(pos) = hit {
            let delta = self.take_to(pos);
            self.text.truncate(pos.max(self.emitted));
            return Pushed::Stop(delta);
        }
        let hold = self.held_back();
        Pushed::Continue(self.take_to(self.text.len() - hold))
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

    /// Length of the longest suffix of the text that is a proper prefix of a stop string.
    fn held_back(&self) -> usize {
        let mut best = 0;
        for s in &self.stops {
            for k in (best + 1..s.len().min(self.text.len() + 1)).rev() {
                if s.is_char_boundary(k) && self.text.ends_with(&s[..k]) {
                    best = k;
                    break;
                }
            }
        }
        best
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
    fn held_text_is_flushed_at_the_end() {
        let (r, text) = run(&["STOP"], &["go ST"]);
        assert_eq!(r[0], Pushed::Continue("go ".into()));
        assert_eq!(r[1], Pushed::Continue("ST".into()));
        assert_eq!(text, "go ST");
    }
}
