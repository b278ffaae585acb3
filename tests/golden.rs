//! golden end-to-end tests (being written).
