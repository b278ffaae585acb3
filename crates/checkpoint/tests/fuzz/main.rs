//! Fuzzing the model-file parsers a user feeds us, as property tests on
//! stable Rust: the GGUF reader and importer (`gguf.rs`) and the safetensors
//! loader (`safetensors.rs`), from the seed corpus in
//! `tests/fuzz-corpus/{gguf,safetensors}` and the micro model of
//! `writer.rs`. `LAMINA_FUZZ_CASES` sets the cases per property.

mod gguf;
mod safetensors;
mod writer;

#[global_allocator]
static ALLOC: fuzzkit::alloc::LimitedAlloc = fuzzkit::alloc::LimitedAlloc;
