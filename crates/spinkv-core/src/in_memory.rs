//! A model held in memory rather than in a directory (the browser build): its content hash
//! computed from the files' bytes, the same digest `spinkv_session::model_hash` computes from a
//! directory, so a session saved in a browser and one saved by the CLI name the same model
//! the same way.

use spinkv_kv::Digest;

use crate::error::InvalidInput;

/// The files a model's content hash covers (the rule of `spinkv_session::model_hash`).
pub fn hashed_model_file(name: &str) -> bool {
    name == "config.json"
        || name == "model.safetensors.index.json"
        || name.ends_with(".safetensors")
}

/// The content hash of a model from its files as `(name, bytes)`; files the hash does not
/// cover are ignored. config.json must be among them.
pub fn model_hash_of_files(files: &[(&str, &[u8])]) -> Result<Digest, InvalidInput> {
    let mut hashed: Vec<&(&str, &[u8])> =
        files.iter().filter(|(n, _)| hashed_model_file(n)).collect();
    if !hashed.iter().any(|(n, _)| *n == "config.json") {
        return Err(InvalidInput(
            "the model's files lack config.json".to_string(),
        ));
    }
    hashed.sort_by(|a, b| a.0.cmp(b.0));
    if let Some(pair) = hashed.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(InvalidInput(format!(
            "the model file {} is given twice",
            pair[0].0
        )));
    }
    // blake3 over the concatenation equals the incremental hash of the same bytes.
    let mut record = b"spinkv model v1".to_vec();
    for (name, bytes) in hashed {
        record.extend_from_slice(&(name.len() as u64).to_le_bytes());
        record.extend_from_slice(name.as_bytes());
        record.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        record.extend_from_slice(&spinkv_session::digest(bytes));
    }
    Ok(spinkv_session::digest(&record))
}

#[cfg(all(test, feature = "fs"))]
mod tests {
    use super::*;

    #[test]
    fn the_hash_of_the_bytes_is_the_hash_of_the_directory() {
        let dir = std::env::temp_dir().join(format!("spinkv-core-hash-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let files: [(&str, &[u8]); 4] = [
            ("config.json", b"{\"a\": 1}"),
            ("model-00002-of-00002.safetensors", b"second shard"),
            ("model-00001-of-00002.safetensors", b"first shard"),
            ("tokenizer.json", b"not hashed"),
        ];
        for (name, bytes) in files {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        let from_dir = spinkv_session::model_hash_verified(&dir).unwrap().digest;
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(model_hash_of_files(&files).unwrap(), from_dir);
        // Order of the list does not matter; content and names do.
        let mut reversed = files;
        reversed.reverse();
        assert_eq!(model_hash_of_files(&reversed).unwrap(), from_dir);
        let changed = [("config.json", &b"{\"a\": 2}"[..]), files[1], files[2]];
        assert_ne!(model_hash_of_files(&changed).unwrap(), from_dir);
        assert!(model_hash_of_files(&files[1..]).is_err());
        assert!(model_hash_of_files(&[files[0], files[0]]).is_err());
    }
}
