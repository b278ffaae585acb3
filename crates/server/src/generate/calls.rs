//! A job's replies read as reasoning ([`crate::reasoning`]), text and tool
//! calls ([`crate::tools::parse`]): whole, streamed, and the calls in
//! OpenAI's shape. Costs: those of [`crate::reasoning::split`],
//! [`crate::tools::split_reply`] and [`crate::tools::CallStream`].

use engine::FinishReason;

use super::Job;
use crate::reasoning;
use crate::responses::{FunctionCallOut, ToolCallOut};
use crate::tools;

impl Job {
    /// A chat reply's reasoning (with a reasoning parser) and the rest of
    /// its text.
    pub(crate) fn reasoning(&self, text: String) -> (Option<String>, String) {
        match self.thinking {
            Some(thinking) => {
                let parts = reasoning::split(&text, thinking);
                (parts.reasoning, parts.content)
            }
            None => (None, text),
        }
    }

    /// A streamed chat reply's reader of reasoning, with a reasoning parser.
    pub(crate) fn reasoning_stream(&self) -> Option<reasoning::ReasoningStream> {
        self.thinking.map(reasoning::ReasoningStream::new)
    }

    /// The reply as text and tool calls ([`crate::tools::split_reply`]);
    /// without tools, or when the reply did not end normally (`stop`), all
    /// of it is text.
    pub(crate) fn split(&self, text: &str, reason: FinishReason) -> tools::Split {
        match &self.tool_names {
            Some(names) if reason == FinishReason::Stop => {
                tools::split_reply(self.call_format, text, names, self.parallel_tool_calls)
            }
            _ => tools::Split {
                content: text.to_string(),
                calls: Vec::new(),
            },
        }
    }

    /// A streamed reply's reader of text and calls, when the request has tools.
    pub(crate) fn call_stream(&self) -> Option<tools::CallStream> {
        self.tool_names
            .as_ref()
            .map(|_| tools::CallStream::new(self.call_format))
    }

    /// The rest of a streamed reply's text and its calls, once it ended.
    pub(crate) fn finish_calls(
        &self,
        calls: tools::CallStream,
        reason: FinishReason,
    ) -> tools::Split {
        let names = self.tool_names.as_deref().map_or(&[][..], Vec::as_slice);
        calls.finish(
            names,
            self.parallel_tool_calls,
            reason == FinishReason::Stop,
        )
    }

    /// Choice `index`'s calls as OpenAI's `tool_calls`.
    pub(crate) fn tool_calls(
        &self,
        index: usize,
        calls: Vec<tools::ParsedCall>,
    ) -> Vec<ToolCallOut> {
        calls
            .into_iter()
            .enumerate()
            .map(|(k, call)| ToolCallOut {
                id: match k {
                    0 => format!("call_{}_{index}", self.request_id),
                    k => format!("call_{}_{index}_{k}", self.request_id),
                },
                kind: "function",
                function: FunctionCallOut {
                    name: call.name,
                    arguments: call.arguments,
                },
            })
            .collect()
    }
}
