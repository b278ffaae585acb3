//! `lamina serve`'s flags for the limits on what a request carries and on
//! how it is read and prepared ([`server::InputLimits`], the work pool, the
//! body rate and read deadline, connections per client address); defaults
//! come from the `server` crate.

use std::time::Duration;

use anyhow::{Result, bail};

fn lim() -> server::InputLimits {
    server::InputLimits::default()
}

#[derive(clap::Args, Debug)]
pub struct LimitArgs {
    /// Most JSON values in one request's schema (`response_format`, or all
    /// `tools` parameters together); more is a 400.
    #[arg(long, default_value_t = lim().schema_nodes, env = "LAMINA_MAX_SCHEMA_NODES")]
    pub max_schema_nodes: usize,
    /// Deepest nesting of objects and arrays in a schema.
    #[arg(long, default_value_t = lim().schema_depth, env = "LAMINA_MAX_SCHEMA_DEPTH")]
    pub max_schema_depth: usize,
    /// Longest `guided_regex` in bytes.
    #[arg(long, default_value_t = lim().regex_bytes, env = "LAMINA_MAX_REGEX_BYTES")]
    pub max_regex_bytes: usize,
    /// Longest `guided_grammar` in bytes.
    #[arg(long, default_value_t = lim().grammar_bytes, env = "LAMINA_MAX_GRAMMAR_BYTES")]
    pub max_grammar_bytes: usize,
    /// Most rules in a `guided_grammar`.
    #[arg(long, default_value_t = lim().grammar_rules, env = "LAMINA_MAX_GRAMMAR_RULES")]
    pub max_grammar_rules: usize,
    /// Deepest nesting of groups in a regex or grammar.
    #[arg(long, default_value_t = lim().pattern_depth, env = "LAMINA_MAX_PATTERN_DEPTH")]
    pub max_pattern_depth: usize,
    /// Most `tools` (and calls in one history message).
    #[arg(long, default_value_t = lim().tools, env = "LAMINA_MAX_TOOLS")]
    pub max_tools: usize,
    /// Longest tool description, call id, call name or `tool_call_id` in bytes.
    #[arg(long, default_value_t = lim().field_bytes, env = "LAMINA_MAX_FIELD_BYTES")]
    pub max_field_bytes: usize,
    /// Longest stop string in bytes.
    #[arg(long, default_value_t = lim().stop_bytes, env = "LAMINA_MAX_STOP_BYTES")]
    pub max_stop_bytes: usize,
    /// Most `messages`.
    #[arg(long, default_value_t = lim().messages, env = "LAMINA_MAX_MESSAGES")]
    pub max_messages: usize,
    /// Requests waiting to be prepared (checks, template, tokenization,
    /// grammar compilation) before 429.
    #[arg(long, default_value_t = server::work::DEFAULT_QUEUE, env = "LAMINA_WORK_QUEUE")]
    pub work_queue: usize,
    /// Seconds preparing one request may take (then 400).
    #[arg(long, default_value_t = server::work::DEFAULT_BUDGET.as_secs_f64(), env = "LAMINA_WORK_BUDGET_SECS")]
    pub work_budget_secs: f64,
    /// Bytes per second a request body must keep up once started, after a
    /// short allowance (then 408; 0: no minimum).
    #[arg(long, default_value_t = server::DEFAULT_MIN_BODY_RATE, env = "LAMINA_MIN_BODY_RATE")]
    pub min_body_rate: u64,
    /// Seconds from a request's headers to the end of its body (then 408).
    #[arg(long, default_value_t = 60.0, env = "LAMINA_REQUEST_READ_TIMEOUT")]
    pub request_read_timeout: f64,
    /// Open connections per client address (0: no cap); one more closes
    /// that address's longest-idle (or longest-reading) connection.
    #[arg(long, env = "LAMINA_MAX_CLIENT_CONNECTIONS")]
    pub max_client_connections: Option<usize>,
}

impl LimitArgs {
    /// Checks the values (before the model loads); errors name the flag.
    pub fn check(&self) -> Result<()> {
        for (flag, v) in [
            ("--work-budget-secs", self.work_budget_secs),
            ("--request-read-timeout", self.request_read_timeout),
        ] {
            if !(v > 0.0 && v.is_finite() && v <= 86_400.0) {
                bail!(
                    "invalid `{flag}`: must be a positive number of seconds (at most a day), got {v}"
                );
            }
        }
        if self.work_queue == 0 {
            bail!("invalid `--work-queue`: must be at least 1");
        }
        Ok(())
    }

    /// Sets these limits on `cfg` (checked by [`LimitArgs::check`]).
    pub fn apply(&self, cfg: &mut server::ServerConfig) {
        cfg.limits = server::InputLimits {
            schema_nodes: self.max_schema_nodes,
            schema_depth: self.max_schema_depth,
            regex_bytes: self.max_regex_bytes,
            grammar_bytes: self.max_grammar_bytes,
            grammar_rules: self.max_grammar_rules,
            pattern_depth: self.max_pattern_depth,
            tools: self.max_tools,
            field_bytes: self.max_field_bytes,
            stop_bytes: self.max_stop_bytes,
            messages: self.max_messages,
        };
        cfg.work_queue = self.work_queue;
        cfg.work_budget = Duration::from_secs_f64(self.work_budget_secs);
        cfg.min_body_rate = self.min_body_rate;
        cfg.read_deadline = Duration::from_secs_f64(self.request_read_timeout);
        if let Some(n) = self.max_client_connections {
            cfg.max_client_connections = n;
        }
    }
}
