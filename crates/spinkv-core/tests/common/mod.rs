//! A tiny random Llama model written to a temp dir, deterministic to the byte, so that digests
//! and identities computed on it can be pinned.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use safetensors::tensor::TensorView;
use safetensors::Dtype;

pub const VOCAB: usize = 61;
const HIDDEN: usize = 32;
const INTER: usize = 48;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;

/// A temp dir removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("spinkv-core-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Writes config.json and model.safetensors (f32) of the tiny model into `dir`.
pub fn write_tiny_model(dir: &Path) {
    let config = format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": {HIDDEN},
            "intermediate_size": {INTER}, "num_hidden_layers": {LAYERS},
            "num_attention_heads": {HEADS}, "num_key_value_heads": {KV_HEADS},
            "vocab_size": {VOCAB}, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": true, "hidden_act": "silu",
            "torch_dtype": "float32"}}"#
    );
    std::fs::write(dir.join("config.json"), config).unwrap();
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![VOCAB, HIDDEN]),
        ("model.norm.weight".into(), vec![HIDDEN]),
    ];
    for i in 0..LAYERS {
        let p = format!("model.layers.{i}");
        for (name, shape) in [
            ("input_layernorm.weight", vec![HIDDEN]),
            ("post_attention_layernorm.weight", vec![HIDDEN]),
            ("self_attn.q_proj.weight", vec![q, HIDDEN]),
            ("self_attn.k_proj.weight", vec![kv, HIDDEN]),
            ("self_attn.v_proj.weight", vec![kv, HIDDEN]),
            ("self_attn.o_proj.weight", vec![HIDDEN, q]),
            ("mlp.gate_proj.weight", vec![INTER, HIDDEN]),
            ("mlp.up_proj.weight", vec![INTER, HIDDEN]),
            ("mlp.down_proj.weight", vec![HIDDEN, INTER]),
        ] {
            shapes.push((format!("{p}.{name}"), shape));
        }
    }
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n = shape.iter().product();
            let v = if name.ends_with("norm.weight") {
                vec![1.0; n]
            } else {
                values(i as u64 + 1, n, 0.3)
            };
            let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name, shape, bytes)
        })
        .collect();
    let views = data.iter().map(|(name, shape, bytes)| {
        (
            name.clone(),
            TensorView::new(Dtype::F32, shape.clone(), bytes).unwrap(),
        )
    });
    let file = safetensors::serialize(views, None).unwrap();
    std::fs::write(dir.join("model.safetensors"), file).unwrap();
}

/// A prompt of `n` tokens.
pub fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 17 + 3) % VOCAB as u32).collect()
}
