//! Content hash of a model directory: config.json, the safetensors index (if any) and every
//! `*.safetensors` file, in name order, each hashed with blake3 over a memory map on all cores.
//!
//! The result is cached in `.spinkv-model-hash` inside the directory, keyed by each file's
//! name, size and modification time; a cache that does not match exactly is ignored and
//! rewritten (atomically, temp file + rename; a read-only directory simply gets no cache).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use spinkv_kv::identity::hex;
use spinkv_kv::{parse_hex_digest, Digest};

pub const CACHE_FILE: &str = ".spinkv-model-hash";
const CACHE_HEADER: &str = "spinkv-model-hash v1";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelHash {
    pub digest: Digest,
    /// Bytes hashed (0 when the digest came from the cache file).
    pub hashed_bytes: u64,
    pub from_cache: bool,
}

/// One hashed file and the key under which its hash is cached.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileKey {
    name: String,
    size: u64,
    mtime_ns: u128,
}

fn model_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let wanted = name == "config.json"
            || name == "model.safetensors.index.json"
            || name.ends_with(".safetensors");
        if wanted && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    if !files.iter().any(|p| p.ends_with("config.json")) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} has no config.json", dir.display()),
        ));
    }
    Ok(files)
}

fn key_of(path: &Path) -> io::Result<FileKey> {
    let meta = fs::metadata(path)?;
    let mtime_ns = meta
        .modified()?
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    Ok(FileKey {
        name: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        size: meta.len(),
        mtime_ns,
    })
}

fn render_cache(digest: &Digest, keys: &[FileKey]) -> String {
    let mut text = format!("{CACHE_HEADER}\n{}\n", hex(digest));
    for key in keys {
        text += &format!("{} {} {}\n", key.size, key.mtime_ns, key.name);
    }
    text
}

fn read_cache(dir: &Path, keys: &[FileKey]) -> Option<Digest> {
    let text = fs::read_to_string(dir.join(CACHE_FILE)).ok()?;
    let mut lines = text.lines();
    if lines.next()? != CACHE_HEADER {
        return None;
    }
    let digest_hex = lines.next()?;
    if render_cache(&[0; 32], keys).lines().skip(2).ne(lines) {
        return None;
    }
    parse_hex_digest(digest_hex).ok()
}

fn write_cache(dir: &Path, digest: &Digest, keys: &[FileKey]) {
    let tmp = dir.join(format!("{CACHE_FILE}.tmp-{}", std::process::id()));
    let written = fs::write(&tmp, render_cache(digest, keys))
        .and_then(|()| fs::rename(&tmp, dir.join(CACHE_FILE)));
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
}

/// The content hash of the model in `dir` (see the module doc), from the cache file when it
/// matches every file's name, size and mtime. Good enough to label a cache being saved; never
/// enough to trust pages being restored (see [`model_hash_verified`]).
pub fn model_hash(dir: &Path) -> io::Result<ModelHash> {
    hash_dir(dir, true)
}

/// The content hash of the model in `dir`, always computed from the files' bytes (and the
/// cache file refreshed). Size and mtime do not prove the content: weights replaced in place
/// by others of the same size with the mtime put back would keep a stale cached hash, and
/// a restore trusting it would run KV pages made by other weights.
pub fn model_hash_verified(dir: &Path) -> io::Result<ModelHash> {
    hash_dir(dir, false)
}

fn hash_dir(dir: &Path, use_cache: bool) -> io::Result<ModelHash> {
    let files = model_files(dir)?;
    let keys = files
        .iter()
        .map(|p| key_of(p))
        .collect::<io::Result<Vec<_>>>()?;
    if let Some(digest) = read_cache(dir, &keys).filter(|_| use_cache) {
        return Ok(ModelHash {
            digest,
            hashed_bytes: 0,
            from_cache: true,
        });
    }
    let mut total = blake3::Hasher::new();
    total.update(b"spinkv model v1");
    let mut hashed_bytes = 0;
    for (path, key) in files.iter().zip(&keys) {
        let mut file = blake3::Hasher::new();
        file.update_mmap_rayon(path)?;
        total.update(&(key.name.len() as u64).to_le_bytes());
        total.update(key.name.as_bytes());
        total.update(&key.size.to_le_bytes());
        total.update(file.finalize().as_bytes());
        hashed_bytes += key.size;
    }
    let digest = *total.finalize().as_bytes();
    // Only cache what did not change while it was hashed.
    let after = files
        .iter()
        .map(|p| key_of(p))
        .collect::<io::Result<Vec<_>>>()?;
    if after == keys {
        write_cache(dir, &digest, &keys);
    }
    Ok(ModelHash {
        digest,
        hashed_bytes,
        from_cache: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("spinkv-hash-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn hashes_content_and_caches_by_size_and_mtime() {
        let dir = temp_dir("a");
        fs::write(dir.join("config.json"), b"{}").unwrap();
        fs::write(dir.join("model.safetensors"), vec![7u8; 100_000]).unwrap();
        fs::write(dir.join("tokenizer.json"), b"not hashed").unwrap();
        let first = model_hash(&dir).unwrap();
        assert!(!first.from_cache && first.hashed_bytes == 100_002);
        let second = model_hash(&dir).unwrap();
        assert!(second.from_cache && second.digest == first.digest);
        // Same content elsewhere: same hash (content, not path).
        let other = temp_dir("b");
        fs::copy(dir.join("config.json"), other.join("config.json")).unwrap();
        fs::copy(
            dir.join("model.safetensors"),
            other.join("model.safetensors"),
        )
        .unwrap();
        assert_eq!(model_hash(&other).unwrap().digest, first.digest);
        // Changed weights (size changes too): a new hash, and the stale cache is ignored.
        fs::write(dir.join("model.safetensors"), vec![8u8; 100_001]).unwrap();
        let third = model_hash(&dir).unwrap();
        assert!(!third.from_cache && third.digest != first.digest);
        // A damaged cache file is ignored.
        fs::write(dir.join(CACHE_FILE), "spinkv-model-hash v1\nzz\n").unwrap();
        assert_eq!(model_hash(&dir).unwrap().digest, third.digest);
        assert!(model_hash(&temp_dir("empty")).is_err());
        for d in [dir, other, temp_dir("empty")] {
            let _ = fs::remove_dir_all(d);
        }
    }

    fn set_mtime(path: &Path, mtime: std::time::SystemTime) {
        fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    }

    #[test]
    fn verified_hash_sees_weights_replaced_with_the_same_size_and_mtime() {
        let dir = temp_dir("same-size");
        let weights = dir.join("model.safetensors");
        fs::write(dir.join("config.json"), b"{}").unwrap();
        fs::write(&weights, vec![1u8; 50_000]).unwrap();
        let mtime = fs::metadata(&weights).unwrap().modified().unwrap();
        let original = model_hash(&dir).unwrap();
        fs::write(&weights, vec![2u8; 50_000]).unwrap();
        set_mtime(&weights, mtime);
        // The cache cannot tell: same name, size and mtime.
        let cached = model_hash(&dir).unwrap();
        assert!(cached.from_cache && cached.digest == original.digest);
        let verified = model_hash_verified(&dir).unwrap();
        assert!(!verified.from_cache && verified.hashed_bytes == 50_002);
        assert_ne!(verified.digest, original.digest);
        // ... and the cache now holds the true hash.
        assert_eq!(model_hash(&dir).unwrap().digest, verified.digest);
        let _ = fs::remove_dir_all(dir);
    }
}
