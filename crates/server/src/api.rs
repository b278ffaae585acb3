//! `POST /v1/chat/completions` and `POST /v1/completions`: parse, check the
//! model and parameters (with the constraint of `response_format` /
//! `guided_*`, [`crate::structured`], and the tools, [`crate::tools`]),
//! build the prompt (chat template or raw text / ids), submit to the engine
//! and answer streamed or whole.
//!
//! Costs per request: one JSON parse, one tokenisation (and template render
//! for chat), O(1) engine submission; then O(1) work per generated token.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Extension, State};
use axum::response::Response;

use crate::body::body_bytes;
use crate::encode::{Input, encode_now};
use crate::error::{ApiError, from_submit};
use crate::generate::{Job, Kind};
use crate::messages::{chat_messages, final_message};
use crate::middleware::RequestId;
use crate::models::Lease;
use crate::params;
use crate::protocol::{self, ChatRequest, CompletionRequest, Prompt};
use crate::state::AppState;
use crate::{structured, tools};
use engine::SubmitError;

/// The common start of a generation request: refused while draining, the
/// body within the limit, then parsed.
pub(crate) fn accept<T: serde::de::DeserializeOwned>(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    if state.is_draining() {
        return Err(ApiError::shutting_down());
    }
    let body = body_bytes(state, body)?;
    protocol::parse(&body)
}

/// Chat completion: the messages rendered with the model's chat template.
///
/// Answers a `chat.completion` object, or with `stream: true` an SSE stream
/// of `chat.completion.chunk` objects ending with `data: [DONE]`.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "openai",
    security(("api_key" = [])),
    request_body = ChatRequest,
    responses(
        (status = 200, description = "A `chat.completion` object, or an SSE stream of `chat.completion.chunk` objects", body = crate::responses::ChatCompletion),
        (status = 400, description = "Bad input, naming the parameter", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
        (status = 429, description = "The queue is full", body = crate::error::ErrorBody),
    ))]
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(RequestId(rid)): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let req: ChatRequest = accept(&state, body)?;
    let model = state
        .models
        .acquire(req.model.as_deref(), req.keep_alive)
        .await?;
    let st = state.clone();
    let job = Job::new(state.clone(), model, Kind::Chat, rid, arrived);
    let (job, handles, stream) = state
        .work
        .run("messages", move || prepare_chat(&st, req, job))
        .await??;
    job.respond(handles, stream).await
}

/// A chat request checked, rendered, tokenized and submitted (a work-pool
/// job): the job, its engine handles and whether it streams. The Anthropic
/// and Responses APIs run their requests through here too.
pub(crate) fn prepare_chat(state: &Arc<AppState>, req: ChatRequest, mut job: Job) -> Prepared {
    let p = chat_prompt(state, &job.served, req)?;
    job.logprobs = p.logprobs;
    job.parallel_tool_calls = p.plan.as_ref().is_none_or(|p| p.parallel);
    job.call_format = p.format;
    job.thinking = p.thinking;
    job.tool_names = p.plan.map(|p| Arc::new(p.names));
    let handles = place(&mut job, &p.checked, p.prompt, p.structured, "messages")?;
    Ok((job, handles, p.checked.stream))
}

/// A chat request checked and rendered to its prompt, not yet submitted.
pub(crate) struct ChatPrompt {
    pub checked: params::Checked,
    pub logprobs: Option<usize>,
    pub plan: Option<tools::ToolPlan>,
    /// How the model writes tool calls.
    pub format: tools::CallFormat,
    /// With a reasoning parser: whether the reply thinks
    /// ([`crate::reasoning::thinking`]).
    pub thinking: Option<bool>,
    pub structured: structured::Structured,
    pub prompt: Vec<u32>,
}

/// Checks a chat request for `model` (its lease) and renders and
/// tokenizes its prompt (every check a submission makes before the
/// engine's own).
pub(crate) fn chat_prompt(
    state: &Arc<AppState>,
    model: &Lease,
    req: ChatRequest,
) -> Result<ChatPrompt, ApiError> {
    let lora = model.lora();
    for field in req.ignored_fields() {
        model.metrics().ignored(field);
    }
    crate::limits::check_chat(&req, &state.cfg.limits)?;
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (_, Some(k)) if k < 0 => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                format!("`top_logprobs` must be >= 0, got {k}."),
            ));
        }
        (Some(true), k) => Some(usize::try_from(k.unwrap_or(0)).unwrap_or(usize::MAX)),
        (_, Some(k)) if k > 0 => {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "`top_logprobs` requires `logprobs` to be true.",
            ));
        }
        _ => None,
    };
    let mut checked = params::check(
        &req.common(),
        logprobs.unwrap_or(0),
        req.max_tokens_param(),
        &model.defaults,
    )
    .map_err(|e| match e.param.as_deref() {
        Some("logprobs") => ApiError {
            param: Some("top_logprobs".into()),
            ..e
        },
        _ => e,
    })?;
    checked.lora = lora;
    crate::messages::template_kwargs(req.chat_template_kwargs.as_ref())?;
    let format = tools::CallFormat::of(model.tokenizer.chat_template());
    let plan = tools::plan(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls,
        format,
    )?;
    // a reply with log-probabilities keeps its text whole; a forced call
    // is the reply from its first token (nothing to split)
    let thinking = model
        .reasoning_parser
        .filter(|_| logprobs.is_none())
        .filter(|_| plan.as_ref().is_none_or(|p| p.constraint.is_none()))
        .map(|_| crate::reasoning::thinking(req.chat_template_kwargs.as_ref()));
    let mut structured = structured::constraint(
        req.response_format.as_ref(),
        req.guided_regex.as_deref(),
        req.guided_grammar.as_deref(),
    )?;
    if let Some(p) = &plan {
        if logprobs.is_some() {
            return Err(ApiError::invalid_param(
                "logprobs",
                "`logprobs` cannot be combined with `tools`: a tool call's tokens are not returned as content.",
            ));
        }
        match &p.constraint {
            Some(c) if structured.constraint.is_some() => {
                let _ = c;
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    format!(
                        "A forced tool call cannot be combined with `{}`: give one constraint.",
                        structured.param
                    ),
                ));
            }
            Some(c) => {
                structured.constraint = Some(c.clone());
                structured.param = "tools";
            }
            // `auto` under the request's own constraint: calls are parsed
            // only, but the definitions must still compile
            None if structured.constraint.is_some() => check_tools(model, p)?,
            // `auto`: text, or calls held to their schemas once started
            None => {
                let marker = model.tokenizer.template_renders_tools()
                    && model.tokenizer.token_to_id(tools::CALL_MARKER).is_some();
                structured.constraint = Some(p.auto_grammar(marker));
                structured.param = "tools";
            }
        }
    }
    let in_template = model.tokenizer.template_renders_tools();
    let mut messages = chat_messages(&req.messages, in_template)?;
    let prefill = match req.continue_final_message {
        Some(true) => Some(final_message(&req.messages, &mut messages)?),
        _ => None,
    };
    if let Some(p) = &plan
        && !in_template
    {
        tools::add_fallback_system(&mut messages, &p.tools);
    }
    let input = Input::Chat {
        messages,
        trusted: req.parse_special_tokens.unwrap_or(false),
        tools: plan
            .as_ref()
            .filter(|_| in_template)
            .map(|p| p.tools.clone()),
        kwargs: req.chat_template_kwargs,
        prefill,
        generation_prompt: true,
    };
    let prompt = encode_now(model, input, "messages")?;
    Ok(ChatPrompt {
        checked,
        logprobs,
        plan,
        format,
        thinking,
        structured,
        prompt,
    })
}

/// What a work-pool job preparing a request hands back.
pub(crate) type Prepared = Result<(Job, Vec<engine::RequestHandle>, bool), ApiError>;

/// Places a checked request (its prompt in `prompt_param`) with its
/// constraint on a replica; `job` takes the choices' settings and the replica.
fn place(
    job: &mut Job,
    checked: &params::Checked,
    prompt: Vec<u32>,
    structured: structured::Structured,
    prompt_param: &str,
) -> Result<Vec<engine::RequestHandle>, ApiError> {
    job.constraint_param = structured.constraint.is_some().then_some(structured.param);
    job.prompt_tokens = prompt.len();
    let model = &job.served;
    let max_tokens = job.state.cfg.default_max_tokens;
    let mut greq = checked.request(prompt, model.max_context(), max_tokens);
    greq.constraint = structured.constraint;
    let placed = model
        .replicas
        .submit_n(greq, checked.best_of)
        .map_err(|e| submit_error(e, prompt_param, checked.max_tokens_param, structured.param))?;
    tracing::debug!(
        engine = placed.replica,
        route = ?placed.route,
        matched_blocks = placed.matched_blocks,
        engine_id = placed.handles[0].id,
        choices = placed.handles.len(),
        "submitted"
    );
    job.include_usage = checked.include_usage;
    job.n = checked.n;
    job.replica = placed.replica;
    Ok(placed.handles)
}

/// A submit refusal as an API error; a constraint the grammar engine
/// refuses names the field it came from (`constraint_param`).
fn submit_error(
    e: SubmitError,
    prompt_param: &str,
    max_tokens_param: &str,
    constraint_param: &'static str,
) -> ApiError {
    match e {
        SubmitError::Grammar(g) => ApiError::invalid_param(
            constraint_param,
            format!("Invalid `{constraint_param}`: {}: {}", g.kind, g.reason),
        ),
        e => from_submit(e, prompt_param, max_tokens_param),
    }
}

/// `tool_choice: auto`: the definitions' schemas compiled once (and
/// dropped), so a bad `parameters` schema is a 400 naming `tools`.
fn check_tools(model: &Lease, plan: &tools::ToolPlan) -> Result<(), ApiError> {
    let Some(engine) = model.replicas.engine(0) else {
        return Ok(());
    };
    engine
        .check_constraint(&plan.check_constraint())
        .map_err(|g| ApiError::invalid_param("tools", format!("Invalid `tools`: {}", g.reason)))
}

/// The completion prompt as token ids (text gets the tokenizer's special tokens).
fn completion_prompt(model: &Lease, prompt: Prompt) -> Result<Vec<u32>, ApiError> {
    let one = |n: usize| {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::invalid_param(
                "prompt",
                format!("Only one prompt per request is supported, got {n}."),
            ))
        }
    };
    let text = |text: String| Input::Text {
        text,
        add_special: true,
    };
    let ids = match prompt {
        Prompt::Text(t) => encode_now(model, text(t), "prompt")?,
        Prompt::Texts(mut v) => {
            one(v.len())?;
            encode_now(model, text(v.remove(0)), "prompt")?
        }
        Prompt::Tokens(ids) => ids,
        Prompt::TokenLists(mut v) => {
            one(v.len())?;
            v.remove(0)
        }
    };
    // ids past the vocabulary are the engine's refusal (`SubmitError::TokenOutOfVocab`)
    Ok(ids)
}

/// Text completion of a text or token-id prompt.
///
/// Answers a `text_completion` object, or with `stream: true` an SSE stream
/// of them ending with `data: [DONE]`.
#[utoipa::path(post, path = "/v1/completions", tag = "openai",
    security(("api_key" = [])),
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "A `text_completion` object, or an SSE stream of them", body = crate::responses::TextCompletion),
        (status = 400, description = "Bad input, naming the parameter", body = crate::error::ErrorBody),
        (status = 401, description = "Missing or wrong API key", body = crate::error::ErrorBody),
        (status = 429, description = "The queue is full", body = crate::error::ErrorBody),
    ))]
pub async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(RequestId(rid)): Extension<RequestId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let req: CompletionRequest = accept(&state, body)?;
    let model = state
        .models
        .acquire(req.model.as_deref(), req.keep_alive)
        .await?;
    let st = state.clone();
    let job = Job::new(state.clone(), model, Kind::Completion, rid, arrived);
    let (job, handles, stream) = state
        .work
        .run("prompt", move || prepare_completion(&st, req, job))
        .await??;
    job.respond(handles, stream).await
}

/// A completion request checked, tokenized and submitted (a work-pool job).
fn prepare_completion(state: &Arc<AppState>, req: CompletionRequest, mut job: Job) -> Prepared {
    let model = job.served.clone();
    let lora = model.lora();
    crate::limits::check_completion(&req, &state.cfg.limits)?;
    let echo = req.echo == Some(true);
    if echo && req.logprobs.is_some() {
        return Err(ApiError::invalid_param(
            "echo",
            "`echo` with `logprobs` is not supported: it needs the log-probabilities of the prompt tokens, which lamina does not compute.",
        ));
    }
    if req.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param(
            "suffix",
            "`suffix` is not supported.",
        ));
    }
    let logprobs = match req.logprobs {
        Some(k) if k < 0 => {
            return Err(ApiError::invalid_param(
                "logprobs",
                format!("`logprobs` must be >= 0, got {k}."),
            ));
        }
        Some(k) => Some(usize::try_from(k).unwrap_or(usize::MAX)),
        None => None,
    };
    let mut checked = params::check(
        &req.common(),
        logprobs.unwrap_or(0),
        "max_tokens",
        &model.defaults,
    )?;
    checked.lora = lora;
    let echo_text = match (&req.prompt, echo) {
        (_, false) => None,
        (Prompt::Text(t), true) => Some(t.clone()),
        (Prompt::Texts(v), true) if v.len() == 1 => Some(v[0].clone()),
        // token ids (or a refused shape): the prompt's text is decoded below
        _ => Some(String::new()),
    };
    let prompt = completion_prompt(&model, req.prompt)?;
    let echo_text = match echo_text {
        Some(t) if t.is_empty() => Some(model.tokenizer.decode(&prompt, false).map_err(|e| {
            ApiError::invalid_param(
                "prompt",
                format!("Cannot decode the prompt to echo it: {e}"),
            )
        })?),
        other => other,
    };
    let structured = structured::constraint(
        req.response_format.as_ref(),
        req.guided_regex.as_deref(),
        req.guided_grammar.as_deref(),
    )?;
    job.logprobs = logprobs;
    job.echo = echo_text;
    let handles = place(&mut job, &checked, prompt, structured, "prompt")?;
    Ok((job, handles, checked.stream))
}
