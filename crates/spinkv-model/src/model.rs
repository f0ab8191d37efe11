//! `Model`: a loaded config + mapped weights, shared read-only by any number of sessions.

use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::weights::Weights;
use spinkv_kernels::WeightDtype;
use spinkv_kv::KvShape;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct Model {
    config: LlamaConfig,
    pub(crate) weights: Weights,
    dir: PathBuf,
}

impl Model {
    /// Load an HF-layout directory: config.json plus model.safetensors or sharded
    /// model-*.safetensors with model.safetensors.index.json. Every tensor is checked for
    /// presence, dtype and shape before this returns.
    pub fn load(dir: &Path) -> Result<Arc<Model>, ModelError> {
        if !dir.is_dir() {
            return Err(ModelError::MissingDir(dir.to_path_buf()));
        }
        let config = LlamaConfig::from_file(&dir.join("config.json"))?;
        let weights = Weights::load(dir, &config)?;
        Ok(Arc::new(Model {
            config,
            weights,
            dir: dir.to_path_buf(),
        }))
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Storage dtype of the embedding matrix (the model's dominant dtype).
    pub fn dtype(&self) -> WeightDtype {
        self.weights.dtype
    }

    /// Size of the mapped safetensors files.
    pub fn file_bytes(&self) -> u64 {
        self.weights.file_bytes
    }

    pub fn kv_shape(&self) -> KvShape {
        KvShape {
            n_layers: self.config.num_hidden_layers,
            n_heads: self.config.num_attention_heads,
            n_kv_heads: self.config.num_key_value_heads,
            head_dim: self.config.head_dim,
        }
    }
}
