//! `Model`: a loaded config + mapped weights, shared read-only by any number of sessions.

use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::weights::{WeightBytes, Weights};
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
    #[cfg(not(target_arch = "wasm32"))]
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

    /// A model from bytes a host handed over (a browser has no files to map): config.json's
    /// text and the safetensors files as `(name, bytes)`, one file or the shards in name order.
    /// The same checks as [`Model::load`]; `origin` (e.g. the model's name) stands for the
    /// directory in errors and in [`Model::dir`]. The buffers are used in place, not copied.
    pub fn from_bytes(
        origin: &str,
        config_json: &str,
        files: Vec<(String, WeightBytes)>,
    ) -> Result<Arc<Model>, ModelError> {
        let dir = PathBuf::from(origin);
        let config = LlamaConfig::from_json(config_json).map_err(|err| match err {
            ModelError::Config { reason, .. } => ModelError::Config {
                path: dir.join("config.json"),
                reason,
            },
            other => other,
        })?;
        let weights = Weights::from_bytes(&dir, files, &config)?;
        Ok(Arc::new(Model {
            config,
            weights,
            dir,
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

    /// Bytes of weights one decode step reads: every layer's projections and the LM head (the
    /// embedding's single row, the norms and biases are left out as negligible).
    pub fn decode_weight_bytes(&self) -> u64 {
        let w = &self.weights;
        let bytes = |m: &crate::weights::Matrix| w.view(m).byte_len() as u64;
        let layers: u64 = w
            .layers
            .iter()
            .map(|l| {
                [
                    &l.q_proj,
                    &l.k_proj,
                    &l.v_proj,
                    &l.o_proj,
                    &l.gate_proj,
                    &l.up_proj,
                    &l.down_proj,
                ]
                .into_iter()
                .map(bytes)
                .sum::<u64>()
            })
            .sum();
        layers + bytes(w.lm_head())
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
