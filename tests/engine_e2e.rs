//! engine_e2e end-to-end tests (being written).
