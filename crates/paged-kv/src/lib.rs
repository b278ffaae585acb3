//! paged-kv
