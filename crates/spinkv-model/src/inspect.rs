//! What a model directory holds, read from config.json and the safetensors headers only (never
//! the tensor data), so it is cheap for any model size. The files are found by the loader's own
//! rule (`weights::weight_files`), the config is parsed by the loader's own parser and the
//! headers are checked by the loader's own walk over the tensors it needs
//! (`weights::check_tensors`: every one present, in a shape and dtype it takes): a model is
//! described exactly as `Model::load` would see it, and one it would refuse is an error (the
//! one `Model::load` would return first).

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::weights::{check_tensors, header_error, read_header, weight_files, Header};

#[derive(Clone, Debug, PartialEq)]
pub struct WeightFile {
    pub path: PathBuf,
    pub bytes: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelInspection {
    /// The directory, canonicalized.
    pub dir: PathBuf,
    pub config: LlamaConfig,
    /// The files `Model::load` maps, in its order.
    pub weight_files: Vec<WeightFile>,
    /// Elements of every tensor stored in `weight_files` (buffers included: what is on disk,
    /// where `LlamaConfig::n_params` is what the forward uses).
    pub parameters: u64,
    /// The dtype holding the most parameters, named as config.json's `torch_dtype`
    /// ("float16", "bfloat16", "float32"; other safetensors tags lowercased).
    pub dtype: String,
    /// Every regular file under `dir` (tokenizer, caches and all): what the model costs on disk.
    pub dir_bytes: u64,
}

impl ModelInspection {
    pub fn weight_bytes(&self) -> u64 {
        self.weight_files.iter().map(|f| f.bytes).sum()
    }
}

/// Describes the model in `dir` (see the module doc).
pub fn inspect(dir: &Path) -> Result<ModelInspection, ModelError> {
    if !dir.is_dir() {
        return Err(ModelError::MissingDir(dir.to_path_buf()));
    }
    let io_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ModelError::Io { path, source }
    };
    let dir = fs::canonicalize(dir).map_err(io_error(dir))?;
    let config = LlamaConfig::from_file(&dir.join("config.json"))?;
    let files = weight_files(&dir)?;
    let mut weight_files_found = Vec::with_capacity(files.len());
    let mut headers = Vec::with_capacity(files.len());
    let mut by_dtype: Vec<(String, u64)> = Vec::new();
    let mut parameters: u64 = 0;
    for path in &files {
        let header = file_header(path)?;
        for (dtype, count) in tensor_counts(&header) {
            parameters = parameters.saturating_add(count);
            match by_dtype.iter_mut().find(|(d, _)| *d == dtype) {
                Some((_, total)) => *total = total.saturating_add(count),
                None => by_dtype.push((dtype, count)),
            }
        }
        let bytes = fs::metadata(path).map_err(io_error(path))?.len();
        weight_files_found.push(WeightFile {
            path: path.clone(),
            bytes,
        });
        headers.push(header);
    }
    check_tensors(&dir, &config, &files, &headers)?;
    // Ties go to the dtype seen first (files in load order, tensors by name).
    let dtype = by_dtype
        .iter()
        .fold(None::<&(String, u64)>, |best, entry| match best {
            Some(b) if b.1 >= entry.1 => Some(b),
            _ => Some(entry),
        })
        .map_or_else(|| "?".to_string(), |(tag, _)| dtype_name(tag));
    Ok(ModelInspection {
        dir_bytes: dir_bytes(&dir),
        dir,
        config,
        weight_files: weight_files_found,
        parameters,
        dtype,
    })
}

fn dtype_name(tag: &str) -> String {
    match tag {
        "F32" => "float32".to_string(),
        "F16" => "float16".to_string(),
        "BF16" => "bfloat16".to_string(),
        "F64" => "float64".to_string(),
        "I8" => "q8_0".to_string(),
        other => other.to_ascii_lowercase(),
    }
}

/// The header of the safetensors file at `path`, read and checked as the loader reads it
/// ([`read_header`]): a file the loader would refuse for its header or length is an error here
/// too.
fn file_header(path: &Path) -> Result<Header, ModelError> {
    let file = File::open(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    read_header(&file).map_err(|error| header_error(path, error))
}

/// (dtype tag, element count) of every tensor in a safetensors header, by tensor name.
fn tensor_counts(header: &Header) -> Vec<(String, u64)> {
    let tensors = header.metadata.tensors();
    let dtype_of = |name: &str| tensors.get(name).map(|t| format!("{:?}", t.dtype));
    // A Q8_0 matrix's scales are part of its storage, not parameters of their own.
    let is_q8_scale = |name: &str| {
        name.strip_suffix(crate::weights::Q8_SCALE_SUFFIX)
            .is_some_and(|matrix| dtype_of(matrix).as_deref() == Some("I8"))
    };
    let mut counts: Vec<(String, String, u64)> = tensors
        .iter()
        .filter(|(name, _)| !is_q8_scale(name))
        .map(|(name, info)| {
            let count = info
                .shape
                .iter()
                .fold(1u64, |n, &d| n.saturating_mul(d as u64));
            (name.clone(), format!("{:?}", info.dtype), count)
        })
        .collect();
    counts.sort_by(|a, b| a.0.cmp(&b.0));
    counts
        .into_iter()
        .map(|(_, dtype, count)| (dtype, count))
        .collect()
}

/// Bytes of the regular files under `dir`; symlinked directories are not followed (no loops),
/// unreadable entries count as nothing (this is a size shown to a person, not a check).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| {
            let path = entry.path();
            match fs::symlink_metadata(&path) {
                Ok(meta) if meta.is_dir() => dir_bytes(&path),
                Ok(_) => fs::metadata(&path)
                    .ok()
                    .filter(|m| m.is_file())
                    .map_or(0, |m| m.len()),
                Err(_) => 0,
            }
        })
        .sum()
}
