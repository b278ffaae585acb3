//! [`RuntimeError`]: why a runtime did not open. A setting refused names
//! itself, its value and the limit; a failure of a lower crate keeps its
//! error as the source, under a line saying what was being done.

/// Why [`crate::Runtime::open`] (or a step of it) failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// A setting out of range, at odds with another, with the model or
    /// with the machine; the message names the setting and its value.
    #[error("{0}")]
    Invalid(String),
    /// The CUDA driver or a device could not be queried.
    #[error("{0}")]
    Device(String),
    #[error(transparent)]
    Store(#[from] checkpoint::store::StoreError),
    #[error(transparent)]
    Load(#[from] checkpoint::loader::LoadError),
    #[error(transparent)]
    Gguf(#[from] checkpoint::gguf::GgufError),
    #[error(transparent)]
    LoraFile(#[from] checkpoint::lora::LoraLoadError),
    #[error(transparent)]
    Tokenizer(#[from] tokenizer::TokenizerError),
    #[error(transparent)]
    Backend(#[from] contract::BackendError),
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
    #[error(transparent)]
    Lora(#[from] engine::LoraRegistryError),
    #[error(transparent)]
    Isa(#[from] cpu_kernels::isa::IsaError),
    /// What was being done when `source` failed.
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: Box<RuntimeError>,
    },
}

/// `Err(RuntimeError::Invalid(..))` from a format string.
macro_rules! invalid {
    ($($arg:tt)*) => {
        return Err($crate::error::RuntimeError::Invalid(format!($($arg)*)))
    };
}
pub(crate) use invalid;

/// Puts a line of context above an error, as a [`RuntimeError::Context`].
pub(crate) trait Context<T> {
    fn context(self, context: impl Into<String>) -> Result<T, RuntimeError>;
    fn with_context<S: Into<String>>(self, f: impl FnOnce() -> S) -> Result<T, RuntimeError>;
}

impl<T, E: Into<RuntimeError>> Context<T> for Result<T, E> {
    fn context(self, context: impl Into<String>) -> Result<T, RuntimeError> {
        self.with_context(|| context)
    }

    fn with_context<S: Into<String>>(self, f: impl FnOnce() -> S) -> Result<T, RuntimeError> {
        self.map_err(|e| RuntimeError::Context {
            context: f().into(),
            source: Box::new(e.into()),
        })
    }
}
