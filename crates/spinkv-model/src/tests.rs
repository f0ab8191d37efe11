//! End-to-end tests on tiny random Llama models written to temp dirs by the tests themselves.

use crate::*;
use half::{bf16, f16};
use safetensors::{tensor::TensorView, Dtype};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

const HIDDEN: usize = 32;
const INTER: usize = 48;
const LAYERS: usize = 2;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;
const VOCAB: usize = 61;
const MAX_POS: usize = 512;

/// A temp dir removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("spinkv-model-test-{}-{n}", std::process::id()));
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

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Store {
    F32,
    F16,
    Bf16,
}

fn random(seed: u64, n: usize, scale: f32) -> Vec<f32> {
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

/// name -> (shape, f32 values) for a tiny model; `untied` adds lm_head.weight.
fn tiny_tensors(untied: bool) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let mut t = BTreeMap::new();
    let mut seed = 1;
    let mut add = |name: String, shape: Vec<usize>, scale: f32, offset: f32| {
        seed += 1;
        let n = shape.iter().product();
        let values = random(seed, n, scale)
            .into_iter()
            .map(|v| v + offset)
            .collect();
        t.insert(name, (shape, values));
    };
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    add(
        "model.embed_tokens.weight".into(),
        vec![VOCAB, HIDDEN],
        1.0,
        0.0,
    );
    for i in 0..LAYERS {
        let p = format!("model.layers.{i}");
        add(
            format!("{p}.input_layernorm.weight"),
            vec![HIDDEN],
            0.2,
            1.0,
        );
        add(
            format!("{p}.self_attn.q_proj.weight"),
            vec![q, HIDDEN],
            0.3,
            0.0,
        );
        add(
            format!("{p}.self_attn.k_proj.weight"),
            vec![kv, HIDDEN],
            0.3,
            0.0,
        );
        add(
            format!("{p}.self_attn.v_proj.weight"),
            vec![kv, HIDDEN],
            0.3,
            0.0,
        );
        add(
            format!("{p}.self_attn.o_proj.weight"),
            vec![HIDDEN, q],
            0.2,
            0.0,
        );
        add(
            format!("{p}.post_attention_layernorm.weight"),
            vec![HIDDEN],
            0.2,
            1.0,
        );
        add(
            format!("{p}.mlp.gate_proj.weight"),
            vec![INTER, HIDDEN],
            0.3,
            0.0,
        );
        add(
            format!("{p}.mlp.up_proj.weight"),
            vec![INTER, HIDDEN],
            0.3,
            0.0,
        );
        add(
            format!("{p}.mlp.down_proj.weight"),
            vec![HIDDEN, INTER],
            0.2,
            0.0,
        );
    }
    add("model.norm.weight".into(), vec![HIDDEN], 0.2, 1.0);
    if untied {
        add("lm_head.weight".into(), vec![VOCAB, HIDDEN], 0.5, 0.0);
    }
    t
}

fn config_json(untied: bool) -> String {
    format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": {HIDDEN}, "intermediate_size": {INTER},
        "num_hidden_layers": {LAYERS}, "num_attention_heads": {HEADS}, "num_key_value_heads": {KV_HEADS},
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": {}, "vocab_size": {VOCAB},
        "max_position_embeddings": {MAX_POS}, "torch_dtype": "float32", "hidden_act": "silu"}}"#,
        !untied
    )
}

fn encode(values: &[f32], store: Store) -> (Dtype, Vec<u8>) {
    match store {
        Store::F32 => (Dtype::F32, bytemuck::cast_slice(values).to_vec()),
        Store::F16 => {
            let v: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
            (Dtype::F16, bytemuck::cast_slice(&v).to_vec())
        }
        Store::Bf16 => {
            let v: Vec<bf16> = values.iter().map(|&x| bf16::from_f32(x)).collect();
            (Dtype::BF16, bytemuck::cast_slice(&v).to_vec())
        }
    }
}

fn serialize(tensors: &BTreeMap<String, (Vec<usize>, Vec<f32>)>, store: Store) -> Vec<u8> {
    let encoded: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = tensors
        .iter()
        .map(|(name, (shape, values))| {
            let (dtype, bytes) = encode(values, store);
            (name.clone(), shape.clone(), dtype, bytes)
        })
        .collect();
    serialize_encoded(&encoded)
}

/// A safetensors file of tensors already encoded: (name, shape, dtype, bytes).
fn serialize_encoded(encoded: &[(String, Vec<usize>, Dtype, Vec<u8>)]) -> Vec<u8> {
    let views = encoded.iter().map(|(name, shape, dtype, bytes)| {
        (
            name.clone(),
            TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
        )
    });
    safetensors::serialize(views, None).unwrap()
}

fn write_model(
    dir: &Path,
    tensors: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    store: Store,
    untied: bool,
) {
    std::fs::write(dir.join("config.json"), config_json(untied)).unwrap();
    std::fs::write(dir.join("model.safetensors"), serialize(tensors, store)).unwrap();
}

pub(crate) fn tiny_model(store: Store, untied: bool) -> (TempDir, std::sync::Arc<Model>) {
    let dir = TempDir::new();
    write_model(&dir.0, &tiny_tensors(untied), store, untied);
    let model = Model::load(&dir.0).unwrap();
    (dir, model)
}

pub(crate) fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 17 + 3) % VOCAB as u32).collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Straightforward f64 Llama forward over the whole sequence (no cache), written from the
/// architecture: the independent check of RoPE layout, GQA mapping, causal mask and MLP.
fn reference_logits(
    tensors: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    tokens: &[u32],
    untied: bool,
) -> Vec<f32> {
    let get = |name: &str| -> Vec<f64> { tensors[name].1.iter().map(|&v| v as f64).collect() };
    let matvec = |w: &[f64], x: &[f64]| -> Vec<f64> {
        w.chunks_exact(x.len())
            .map(|row| row.iter().zip(x).map(|(a, b)| a * b).sum())
            .collect()
    };
    let norm = |x: &[f64], g: &[f64]| -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + 1e-5).sqrt();
        x.iter().zip(g).map(|(v, g)| v * inv * g).collect()
    };
    let rope = |v: &mut [f64], pos: usize| {
        let half = HEAD_DIM / 2;
        for head in v.chunks_exact_mut(HEAD_DIM) {
            for i in 0..half {
                let angle = pos as f64 / 10000f64.powf(2.0 * i as f64 / HEAD_DIM as f64);
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * angle.cos() - b * angle.sin();
                head[i + half] = b * angle.cos() + a * angle.sin();
            }
        }
    };
    let embed = get("model.embed_tokens.weight");
    let mut xs: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&t| embed[t as usize * HIDDEN..(t as usize + 1) * HIDDEN].to_vec())
        .collect();
    for l in 0..LAYERS {
        let p = format!("model.layers.{l}");
        let (wq, wk, wv, wo) = (
            get(&format!("{p}.self_attn.q_proj.weight")),
            get(&format!("{p}.self_attn.k_proj.weight")),
            get(&format!("{p}.self_attn.v_proj.weight")),
            get(&format!("{p}.self_attn.o_proj.weight")),
        );
        let normed: Vec<Vec<f64>> = xs
            .iter()
            .map(|x| norm(x, &get(&format!("{p}.input_layernorm.weight"))))
            .collect();
        let mut qs: Vec<Vec<f64>> = normed.iter().map(|x| matvec(&wq, x)).collect();
        let mut ks: Vec<Vec<f64>> = normed.iter().map(|x| matvec(&wk, x)).collect();
        let vs: Vec<Vec<f64>> = normed.iter().map(|x| matvec(&wv, x)).collect();
        for (pos, (q, k)) in qs.iter_mut().zip(ks.iter_mut()).enumerate() {
            rope(q, pos);
            rope(k, pos);
        }
        for t in 0..tokens.len() {
            let mut attn = vec![0.0; HEADS * HEAD_DIM];
            for h in 0..HEADS {
                let kvh = h / (HEADS / KV_HEADS);
                let q = &qs[t][h * HEAD_DIM..(h + 1) * HEAD_DIM];
                let scores: Vec<f64> = (0..=t)
                    .map(|s| {
                        let k = &ks[s][kvh * HEAD_DIM..(kvh + 1) * HEAD_DIM];
                        q.iter().zip(k).map(|(a, b)| a * b).sum::<f64>() / (HEAD_DIM as f64).sqrt()
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let total: f64 = exps.iter().sum();
                for (s, e) in exps.iter().enumerate() {
                    for d in 0..HEAD_DIM {
                        attn[h * HEAD_DIM + d] += e / total * vs[s][kvh * HEAD_DIM + d];
                    }
                }
            }
            let o = matvec(&wo, &attn);
            xs[t].iter_mut().zip(&o).for_each(|(x, o)| *x += o);
            let n = norm(
                &xs[t],
                &get(&format!("{p}.post_attention_layernorm.weight")),
            );
            let g = matvec(&get(&format!("{p}.mlp.gate_proj.weight")), &n);
            let u = matvec(&get(&format!("{p}.mlp.up_proj.weight")), &n);
            let h: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let d = matvec(&get(&format!("{p}.mlp.down_proj.weight")), &h);
            xs[t].iter_mut().zip(&d).for_each(|(x, d)| *x += d);
        }
    }
    let head = get(if untied {
        "lm_head.weight"
    } else {
        "model.embed_tokens.weight"
    });
    xs.iter()
        .flat_map(|x| matvec(&head, &norm(x, &get("model.norm.weight"))))
        .map(|v| v as f32)
        .collect()
}

#[test]
fn matches_f64_reference_tied_and_untied() {
    for untied in [false, true] {
        let tensors = tiny_tensors(untied);
        let dir = TempDir::new();
        write_model(&dir.0, &tensors, Store::F32, untied);
        let model = Model::load(&dir.0).unwrap();
        let tokens = prompt(20);
        let mut session = Session::new(model, KvConfig::fp16()).unwrap();
        let logits = session.prefill(&tokens, true).unwrap().unwrap();
        let expected = reference_logits(&tensors, &tokens, untied);
        // The fp16 KV cache rounds K and V, so allow a little more than f32 noise.
        let diff = max_abs_diff(&logits, &expected);
        assert!(diff < 1e-2, "untied={untied}: max |Δlogit| = {diff}");
    }
}

#[test]
fn prefill_all_logits_equals_stepwise_decode() {
    for store in [Store::F32, Store::F16, Store::Bf16] {
        let (_dir, model) = tiny_model(store, false);
        // Longer than one prefill chunk, so chunk boundaries are covered too.
        let tokens = prompt(PREFILL_BLOCK_TOKENS + 9);
        let mut batched = Session::new(model.clone(), KvConfig::fp16()).unwrap();
        let all = batched.prefill(&tokens, true).unwrap().unwrap();
        assert_eq!(all.len(), tokens.len() * VOCAB);
        assert_eq!(batched.last_logits(), &all[all.len() - VOCAB..]);

        let mut stepwise = Session::new(model, KvConfig::fp16()).unwrap();
        stepwise.prefill(&tokens[..1], false).unwrap();
        let mut worst = max_abs_diff(stepwise.last_logits(), &all[..VOCAB]);
        for (t, &token) in tokens.iter().enumerate().skip(1) {
            stepwise.decode(token).unwrap();
            worst = worst.max(max_abs_diff(
                stepwise.last_logits(),
                &all[t * VOCAB..(t + 1) * VOCAB],
            ));
        }
        // Batched and single-token kernels sum in different orders (and decode attention
        // splits the context across threads); a 1-ulp f32 difference can flip the fp16 rounding
        // of a cached K/V value. So the stated bound is 1e-4 relative to the logit scale.
        let scale = all.iter().fold(1.0f32, |m, v| m.max(v.abs()));
        assert!(
            worst < 1e-4 * scale,
            "max |Δlogit| prefill vs decode = {worst} (logit scale {scale})"
        );
        assert_eq!(stepwise.tokens(), &tokens[..]);
    }
}

#[test]
fn multi_turn_prefill_continues_the_cache() {
    let (_dir, model) = tiny_model(Store::F32, false);
    let tokens = prompt(30);
    let mut whole = Session::new(model.clone(), KvConfig::fp16()).unwrap();
    whole.prefill(&tokens, false).unwrap();
    let mut turns = Session::new(model, KvConfig::fp16()).unwrap();
    turns.prefill(&tokens[..11], false).unwrap();
    turns.prefill(&tokens[11..], false).unwrap();
    assert!(max_abs_diff(whole.last_logits(), turns.last_logits()) < 1e-4);
}

#[test]
fn truncate_and_redo_reproduces_logits() {
    let (_dir, model) = tiny_model(Store::F16, true);
    let tokens = prompt(40);
    let mut session = Session::new(model, KvConfig::fp16()).unwrap();
    session.prefill(&tokens, false).unwrap();
    let before = session.last_logits().to_vec();
    session.truncate(25);
    assert_eq!(session.len(), 25);
    assert!(session.last_logits().is_empty());
    session.prefill(&tokens[25..], false).unwrap();
    assert!(max_abs_diff(&before, session.last_logits()) < 1e-4);
    session.reset();
    assert_eq!(session.len(), 0);
    assert_eq!(session.cache_stats().tokens, 0);
}

#[test]
fn sharded_weights_load_like_a_single_file() {
    let tensors = tiny_tensors(false);
    let single = TempDir::new();
    write_model(&single.0, &tensors, Store::F16, false);
    let sharded = TempDir::new();
    std::fs::write(sharded.0.join("config.json"), config_json(false)).unwrap();
    let (first, second): (BTreeMap<_, _>, BTreeMap<_, _>) = tensors
        .clone()
        .into_iter()
        .partition(|(name, _)| name.contains("layers.0") || name.contains("embed"));
    let mut weight_map = serde_json::Map::new();
    for (file, part) in [
        ("model-00001-of-00002.safetensors", &first),
        ("model-00002-of-00002.safetensors", &second),
    ] {
        std::fs::write(sharded.0.join(file), serialize(part, Store::F16)).unwrap();
        for name in part.keys() {
            weight_map.insert(name.clone(), file.into());
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": weight_map});
    std::fs::write(
        sharded.0.join("model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();

    let tokens = prompt(12);
    let logits = |dir: &Path| {
        let mut s = Session::new(Model::load(dir).unwrap(), KvConfig::fp16()).unwrap();
        s.prefill(&tokens, true).unwrap().unwrap()
    };
    assert_eq!(logits(&single.0), logits(&sharded.0));
}

fn load_err(dir: &Path) -> ModelError {
    match Model::load(dir) {
        Ok(_) => panic!("{} loaded but should not have", dir.display()),
        Err(e) => e,
    }
}

/// A model directory with the tiny config.json, and the bytes of its F16 weights file (not
/// written: each test writes its own variant of it).
fn config_and_f16_weights() -> (TempDir, Vec<u8>) {
    let dir = TempDir::new();
    std::fs::write(dir.0.join("config.json"), config_json(false)).unwrap();
    (dir, serialize(&tiny_tensors(false), Store::F16))
}

#[test]
fn truncated_or_corrupted_safetensors_is_an_error() {
    let (dir, bytes) = config_and_f16_weights();
    for broken in [
        bytes[..bytes.len() - 100].to_vec(), // truncated data
        bytes[..5].to_vec(),                 // truncated length prefix
        {
            let mut b = bytes.clone(); // header length pointing past the end
            b[..8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
            b
        },
        {
            let mut b = bytes.clone(); // garbage in the JSON header
            b[10] = b'#';
            b[11] = 0xFF;
            b
        },
        Vec::new(),
        {
            let mut b = bytes.clone(); // bytes after the data the header describes
            b.extend_from_slice(&[0u8; 4096]);
            b
        },
    ] {
        std::fs::write(dir.0.join("model.safetensors"), &broken).unwrap();
        let err = load_err(&dir.0);
        assert!(matches!(err, ModelError::Safetensors { .. }), "{err}");
        assert!(err.to_string().contains("model.safetensors"), "{err}");
    }
}

#[test]
fn a_file_longer_than_its_header_says_is_refused_before_its_data_is_read() {
    // A sparse file: 1 GiB long, a few KB on disk. Refused from its header alone, so the
    // error comes at once and nothing of that size is read.
    let (dir, bytes) = config_and_f16_weights();
    let path = dir.0.join("model.safetensors");
    std::fs::write(&path, &bytes).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(1 << 30).unwrap();
    drop(file);
    let err = load_err(&dir.0);
    assert!(err.to_string().contains("its header describes"), "{err}");
}

#[test]
fn every_cut_or_flipped_header_byte_is_an_error_or_loads() {
    // Property: corrupting the length prefix or the JSON header of a valid file either still
    // loads or is a ModelError naming the file; nothing panics.
    let (dir, bytes) = config_and_f16_weights();
    let header_end = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..200 {
        let mut broken = bytes.clone();
        if next() % 2 == 0 {
            broken.truncate((next() % header_end as u64) as usize);
        } else {
            let at = (next() % header_end as u64) as usize;
            broken[at] = next() as u8;
        }
        std::fs::write(dir.0.join("model.safetensors"), &broken).unwrap();
        if let Err(err) = Model::load(&dir.0) {
            assert!(err.to_string().contains("model"), "{err}");
        }
    }
}

#[test]
fn missing_tensor_wrong_shape_and_dtype_are_named() {
    let dir = TempDir::new();
    let mut tensors = tiny_tensors(false);
    tensors.remove("model.layers.1.mlp.up_proj.weight");
    write_model(&dir.0, &tensors, Store::F32, false);
    let err = load_err(&dir.0);
    assert!(
        matches!(&err, ModelError::MissingTensor { name } if name == "model.layers.1.mlp.up_proj.weight"),
        "{err}"
    );

    // vocab/embedding mismatch: config says 61 tokens, embedding has 60 rows.
    let mut tensors = tiny_tensors(false);
    let embed = tensors.get_mut("model.embed_tokens.weight").unwrap();
    embed.0 = vec![VOCAB - 1, HIDDEN];
    embed.1.truncate((VOCAB - 1) * HIDDEN);
    write_model(&dir.0, &tensors, Store::F32, false);
    let err = load_err(&dir.0);
    assert!(
        matches!(&err, ModelError::ShapeMismatch { name, .. } if name == "model.embed_tokens.weight"),
        "{err}"
    );

    // Untied config without lm_head.weight.
    write_model(&dir.0, &tiny_tensors(false), Store::F32, false);
    std::fs::write(dir.0.join("config.json"), config_json(true)).unwrap();
    assert!(
        matches!(load_err(&dir.0), ModelError::MissingTensor { name } if name == "lm_head.weight")
    );

    // Integer weights.
    let tensors = tiny_tensors(false);
    let views: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = tensors
        .iter()
        .map(|(n, (s, v))| {
            let (dtype, bytes) = if n == "model.norm.weight" {
                (
                    Dtype::I32,
                    v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
                )
            } else {
                encode(v, Store::F32)
            };
            (n.clone(), s.clone(), dtype, bytes)
        })
        .collect();
    let bytes = safetensors::serialize(
        views
            .iter()
            .map(|(n, s, d, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())),
        None,
    )
    .unwrap();
    std::fs::write(dir.0.join("config.json"), config_json(false)).unwrap();
    std::fs::write(dir.0.join("model.safetensors"), bytes).unwrap();
    assert!(matches!(
        load_err(&dir.0),
        ModelError::UnsupportedDtype { .. }
    ));
}

#[test]
fn missing_dir_weights_and_bad_architecture() {
    let dir = TempDir::new();
    assert!(matches!(
        load_err(&dir.0.join("nope")),
        ModelError::MissingDir(_)
    ));
    assert!(matches!(load_err(&dir.0), ModelError::Io { .. }));
    std::fs::write(dir.0.join("config.json"), config_json(false)).unwrap();
    assert!(matches!(load_err(&dir.0), ModelError::NoWeights(_)));
    std::fs::write(
        dir.0.join("config.json"),
        config_json(false).replace("LlamaForCausalLM", "BertModel"),
    )
    .unwrap();
    let err = load_err(&dir.0);
    assert!(matches!(err, ModelError::UnsupportedArchitecture(_)));
    assert!(err.to_string().contains("BertModel"));
}

#[test]
fn context_and_token_errors_leave_the_session_untouched() {
    let (_dir, model) = tiny_model(Store::F32, false);
    let kv = KvConfig {
        max_tokens: 16,
        ..KvConfig::fp16()
    };
    let mut session = Session::new(model, kv).unwrap();
    assert_eq!(session.max_context(), 16);
    session.prefill(&prompt(10), false).unwrap();
    let logits = session.last_logits().to_vec();
    let err = session.prefill(&prompt(7), false).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::ContextOverflow {
                len: 10,
                adding: 7,
                max: 16
            }
        ),
        "{err}"
    );
    let err = session.decode(VOCAB as u32).unwrap_err();
    assert!(matches!(err, ModelError::TokenOutOfRange { .. }), "{err}");
    assert!(matches!(
        session.prefill(&[], false),
        Err(ModelError::EmptyPrompt)
    ));
    assert_eq!(session.len(), 10);
    assert_eq!(session.last_logits(), &logits[..]);
    session.prefill(&prompt(6), false).unwrap();
    assert_eq!(session.len(), 16);
    assert!(session.decode(1).is_err());
}

#[test]
fn session_sampling_is_seeded_and_timed() {
    let (_dir, model) = tiny_model(Store::F16, false);
    let run = || {
        let mut session = Session::new(model.clone(), KvConfig::fp16()).unwrap();
        let params = SamplerParams {
            temperature: 0.8,
            top_p: 0.95,
            seed: Some(7),
            ..Default::default()
        };
        let mut sampler = Sampler::new(params).unwrap();
        assert!(matches!(
            session.sample(&mut sampler),
            Err(ModelError::NoLogits)
        ));
        session.prefill(&prompt(5), false).unwrap();
        let mut out = Vec::new();
        for _ in 0..10 {
            let t = session.sample(&mut sampler).unwrap();
            session.decode(t).unwrap();
            out.push(t);
        }
        let timings = session.timings().clone();
        assert_eq!(
            (
                timings.prefill_tokens,
                timings.decode_tokens,
                timings.samples
            ),
            (5, 10, 10)
        );
        assert!(timings.prefill_ns > 0 && timings.decode_ns > 0 && timings.matmul_ns > 0);
        assert!(
            timings.attention_ns + timings.matmul_ns + timings.other_ns
                <= timings.prefill_ns + timings.decode_ns
        );
        session.reset_timings();
        assert_eq!(session.timings(), &PhaseTimings::default());
        out
    };
    assert_eq!(run(), run());
}

/// Held by the tests that set or check the process-wide thread count (tests run in parallel).
static THREAD_COUNT: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn single_thread_pool_gives_the_same_logits() {
    let _count = THREAD_COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let (_dir, model) = tiny_model(Store::Bf16, false);
    let tokens = prompt(9);
    let logits = || {
        let mut s = Session::new(model.clone(), KvConfig::fp16()).unwrap();
        s.prefill(&tokens, true).unwrap().unwrap()
    };
    let default = logits();
    set_threads(1).unwrap();
    let one = logits();
    set_threads(0).unwrap();
    assert_eq!(default, one);
}

/// config.json of the tiny model with `key` set to the raw JSON `value`.
fn config_with(key: &str, value: &str) -> String {
    let mut config: serde_json::Value = serde_json::from_str(&config_json(true)).unwrap();
    config[key] = serde_json::Value::Null;
    config
        .to_string()
        .replace(&format!("\"{key}\":null"), &format!("\"{key}\":{value}"))
}

#[test]
fn a_layer_count_the_weights_do_not_have_is_refused_before_allocating() {
    let dir = TempDir::new();
    write_model(&dir.0, &tiny_tensors(false), Store::F32, true);
    // u64::MAX used to panic "capacity overflow", 1e9 and 2^31 to abort on a ~440 GB
    // allocation of per-layer records; 1 and 3 used to load (1 silently ignored a layer).
    for layers in ["18446744073709551615", "1000000000", "2147483648", "1", "3"] {
        std::fs::write(
            dir.0.join("config.json"),
            config_with("num_hidden_layers", layers),
        )
        .unwrap();
        let err = load_err(&dir.0);
        assert!(matches!(err, ModelError::Config { .. }), "{layers}: {err}");
        assert!(
            err.to_string().contains("num_hidden_layers"),
            "{layers}: {err}"
        );
        assert!(!err.to_string().contains('\n'), "{err}");
    }
    let mut tensors = tiny_tensors(false);
    tensors.retain(|name, _| !name.starts_with("model.layers.0."));
    tensors.insert(
        "model.layers.2.input_layernorm.weight".into(),
        (vec![HIDDEN], vec![1.0; HIDDEN]),
    );
    write_model(&dir.0, &tensors, Store::F32, true);
    let err = load_err(&dir.0);
    assert!(err.to_string().contains("not 0 to N-1"), "{err}");
}

#[test]
fn thread_counts_beyond_the_maximum_are_errors_and_keep_the_pool() {
    let _count = THREAD_COUNT.lock().unwrap_or_else(|e| e.into_inner());
    let before = threads();
    for n in [MAX_THREADS + 1, 1000, 99_999_999_999] {
        let err = set_threads(n).unwrap_err();
        assert!(matches!(err, ModelError::Threads(_)), "{err}");
        assert!(err.to_string().contains("at most 256"), "{err}");
    }
    assert_eq!(threads(), before);
}

#[test]
fn inspection_describes_the_files_the_loader_maps() {
    for (store, name) in [(Store::F16, "float16"), (Store::Bf16, "bfloat16")] {
        let (dir, model) = tiny_model(store, true);
        std::fs::write(dir.0.join("tokenizer.json"), b"{\"not\": \"weights\"}").unwrap();
        let seen = inspect(&dir.0).unwrap();
        assert_eq!(&seen.config, model.config());
        let files: Vec<_> = seen
            .weight_files
            .iter()
            .map(|f| f.path.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(files, ["model.safetensors"]);
        assert_eq!(seen.weight_bytes(), model.file_bytes());
        // The tiny model stores exactly the tensors the forward uses.
        assert_eq!(seen.parameters, model.config().n_params() as u64);
        assert_eq!(seen.dtype, name);
        assert!(
            seen.dir_bytes > seen.weight_bytes(),
            "tokenizer and config count too"
        );
    }
}

#[test]
fn inspection_refuses_what_the_loader_refuses() {
    let dir = TempDir::new();
    assert!(matches!(
        inspect(&dir.0.join("missing")),
        Err(ModelError::MissingDir(_))
    ));
    std::fs::write(dir.0.join("config.json"), config_json(false)).unwrap();
    assert!(matches!(inspect(&dir.0), Err(ModelError::NoWeights(_))));
    std::fs::write(dir.0.join("model.safetensors"), [0xff; 16]).unwrap();
    assert!(matches!(
        inspect(&dir.0),
        Err(ModelError::Safetensors { .. })
    ));
}

/// The tiny model's tensors as safetensors bytes, `odd` (if any) stored as zeros of `dtype`.
fn serialize_with_dtype(
    tensors: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    odd: &str,
    dtype: Dtype,
) -> Vec<u8> {
    let stored: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = tensors
        .iter()
        .map(|(name, (shape, values))| {
            let (dtype, bytes) = if name == odd {
                (dtype, vec![0u8; values.len() * dtype.bitsize() / 8])
            } else {
                encode(values, Store::F16)
            };
            (name.clone(), shape.clone(), dtype, bytes)
        })
        .collect();
    serialize_encoded(&stored)
}

/// `inspect` and `Model::load` agree on every model: both succeed, or both fail with the same
/// error (the first problem the loader meets).
fn assert_inspection_agrees_with_the_loader(dir: &Path) -> Option<String> {
    let seen = inspect(dir).map(drop).map_err(|e| e.to_string());
    let loaded = Model::load(dir).map(drop).map_err(|e| e.to_string());
    assert_eq!(seen, loaded, "{}", dir.display());
    seen.err()
}

#[test]
fn inspection_names_a_missing_tensor() {
    let dir = TempDir::new();
    let mut tensors = tiny_tensors(false);
    tensors.remove("model.layers.1.mlp.up_proj.weight");
    write_model(&dir.0, &tensors, Store::F16, false);
    let err = inspect(&dir.0).unwrap_err();
    assert!(
        matches!(&err, ModelError::MissingTensor { name } if name == "model.layers.1.mlp.up_proj.weight"),
        "{err}"
    );
    assert_eq!(
        assert_inspection_agrees_with_the_loader(&dir.0).as_deref(),
        Some(err.to_string().as_str())
    );
}

#[test]
fn inspection_refuses_every_dtype_the_loader_refuses() {
    let dir = TempDir::new();
    std::fs::write(dir.0.join("config.json"), config_json(false)).unwrap();
    for dtype in [Dtype::F64, Dtype::U8, Dtype::I32, Dtype::BOOL] {
        let bytes = serialize_with_dtype(
            &tiny_tensors(false),
            "model.layers.1.mlp.up_proj.weight",
            dtype,
        );
        std::fs::write(dir.0.join("model.safetensors"), bytes).unwrap();
        let err = inspect(&dir.0).unwrap_err();
        assert!(
            matches!(&err, ModelError::UnsupportedDtype { name, .. } if name == "model.layers.1.mlp.up_proj.weight"),
            "{dtype:?}: {err}"
        );
        assert!(err.to_string().contains(&format!("{dtype:?}")), "{err}");
        assert_inspection_agrees_with_the_loader(&dir.0);
    }
    // A norm stored as I8 (Q8_0 is for matrices only).
    let bytes = serialize_with_dtype(&tiny_tensors(false), "model.norm.weight", Dtype::I8);
    std::fs::write(dir.0.join("model.safetensors"), bytes).unwrap();
    assert!(matches!(
        inspect(&dir.0),
        Err(ModelError::UnsupportedDtype { .. })
    ));
    assert_inspection_agrees_with_the_loader(&dir.0);
}

/// A safetensors file's bytes with one tensor's header `dtype` replaced by `dtype` (any JSON:
/// a name the format does not define, say); the tensor data stays as it was.
fn with_header_dtype(file: &[u8], tensor: &str, dtype: serde_json::Value) -> Vec<u8> {
    let len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&file[8..8 + len]).unwrap();
    header[tensor]["dtype"] = dtype;
    let mut json = serde_json::to_vec(&header).unwrap();
    json.resize(json.len().next_multiple_of(8), b' ');
    [
        &(json.len() as u64).to_le_bytes()[..],
        &json,
        &file[8 + len..],
    ]
    .concat()
}

#[test]
fn a_dtype_the_format_does_not_define_is_one_line_naming_the_tensor() {
    let dir = TempDir::new();
    std::fs::write(dir.0.join("config.json"), config_json(false)).unwrap();
    let tensor = "model.layers.1.mlp.up_proj.weight";
    let valid = serialize_with_dtype(&tiny_tensors(false), tensor, Dtype::U8);
    for (dtype, shown) in [
        (serde_json::json!("Q4_K"), "Q4_K"),
        (serde_json::json!(4), "4"),
    ] {
        let bytes = with_header_dtype(&valid, tensor, dtype);
        std::fs::write(dir.0.join("model.safetensors"), &bytes).unwrap();
        let expected = format!(
            "tensor {tensor} in model.safetensors has dtype {shown}; \
             spinkv reads F16, BF16, F32 or Q8_0 (I8)"
        );
        assert_eq!(inspect(&dir.0).unwrap_err().to_string(), expected);
        assert_eq!(load_err(&dir.0).to_string(), expected);
        let files = vec![(
            "model.safetensors".to_string(),
            WeightBytes::copy_from(&bytes).unwrap(),
        )];
        let err = Model::from_bytes("tiny", &config_json(false), files)
            .err()
            .unwrap();
        assert!(
            matches!(&err, ModelError::UnsupportedDtype { name, dtype, .. } if name == tensor && dtype == shown),
            "{err}"
        );
    }
}

/// Property: removing any one tensor, or storing it in any dtype, gives the same verdict from
/// `inspect` (headers only) as from `Model::load`, untied and tied.
#[test]
fn inspection_and_the_loader_agree_on_every_damaged_tensor() {
    let dir = TempDir::new();
    for untied in [false, true] {
        let tensors = tiny_tensors(untied);
        std::fs::write(dir.0.join("config.json"), config_json(untied)).unwrap();
        let mut refused = 0;
        for name in tensors.keys() {
            let mut fewer = tensors.clone();
            fewer.remove(name);
            std::fs::write(
                dir.0.join("model.safetensors"),
                serialize(&fewer, Store::F16),
            )
            .unwrap();
            refused += usize::from(assert_inspection_agrees_with_the_loader(&dir.0).is_some());
            for dtype in [Dtype::F64, Dtype::U8, Dtype::I8, Dtype::F32, Dtype::BF16] {
                let bytes = serialize_with_dtype(&tensors, name, dtype);
                std::fs::write(dir.0.join("model.safetensors"), bytes).unwrap();
                assert_inspection_agrees_with_the_loader(&dir.0);
            }
        }
        assert_eq!(
            refused,
            tensors.len(),
            "every tensor of the tiny model is needed"
        );
    }
    // A tied model with an lm_head.weight anyway: the extra tensor is not needed, both load.
    std::fs::write(dir.0.join("config.json"), config_json(false)).unwrap();
    std::fs::write(
        dir.0.join("model.safetensors"),
        serialize(&tiny_tensors(true), Store::F16),
    )
    .unwrap();
    assert_eq!(assert_inspection_agrees_with_the_loader(&dir.0), None);
}

#[test]
fn weights_from_bytes_match_the_mapped_files() {
    let tensors = tiny_tensors(true);
    let (dir, mapped) = {
        let dir = TempDir::new();
        write_model(&dir.0, &tensors, Store::F16, true);
        let model = Model::load(&dir.0).unwrap();
        (dir, model)
    };
    let weights = std::fs::read(dir.0.join("model.safetensors")).unwrap();
    let files = vec![(
        "model.safetensors".to_string(),
        WeightBytes::copy_from(&weights).unwrap(),
    )];
    let from_bytes = Model::from_bytes("tiny", &config_json(true), files).unwrap();
    assert_eq!(from_bytes.dir(), Path::new("tiny"));
    assert_eq!(from_bytes.file_bytes(), mapped.file_bytes());
    let tokens = prompt(9);
    let logits = |model: std::sync::Arc<Model>| {
        let mut s = Session::new(model, KvConfig::fp16()).unwrap();
        s.prefill(&tokens, true).unwrap().unwrap()
    };
    assert_eq!(logits(from_bytes), logits(mapped));

    // The loader's checks hold for bytes too, with the origin in the message.
    let half = WeightBytes::copy_from(&weights[..weights.len() / 2]).unwrap();
    let err = Model::from_bytes(
        "tiny",
        &config_json(true),
        vec![("model.safetensors".into(), half)],
    )
    .err()
    .unwrap();
    assert!(err.to_string().contains("tiny/model.safetensors"), "{err}");
    let err = Model::from_bytes("tiny", "{", Vec::new()).err().unwrap();
    assert!(err.to_string().contains("tiny/config.json"), "{err}");
    assert!(matches!(
        Model::from_bytes("tiny", &config_json(true), Vec::new()),
        Err(ModelError::NoWeights(_))
    ));
}

/// Q8_0 as a quantizer writes it: per block of 32, scale = absmax / 127 (as f16), codes
/// rounded. Returns (codes, scales, the dequantized values the runtime must compute with).
fn quantize_q8(values: &[f32]) -> (Vec<i8>, Vec<f16>, Vec<f32>) {
    let (mut codes, mut scales, mut dequantized) = (Vec::new(), Vec::new(), Vec::new());
    for block in values.chunks(spinkv_kernels::Q8_BLOCK) {
        let absmax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let scale = f16::from_f32(absmax / 127.0);
        let inverse = if absmax > 0.0 { 127.0 / absmax } else { 0.0 };
        scales.push(scale);
        for &v in block {
            let code = (v * inverse).round().clamp(-127.0, 127.0) as i8;
            codes.push(code);
            dequantized.push(code as f32 * scale.to_f32());
        }
    }
    (codes, scales, dequantized)
}

/// ‖a − b‖ / ‖b‖.
fn relative_error(a: &[f32], b: &[f32]) -> f32 {
    let diff: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let norm: f32 = b.iter().map(|y| y * y).sum();
    (diff / norm).sqrt()
}

/// Q8_0 matrices compute with activations quantized to 16 bits per block of 32
/// (`spinkv_kernels::q8dot`), so their logits equal the f32 model's on the dequantized values
/// up to that rounding (measured ~5e-4 relative), in prefill (matmul) and decode (matvec).
#[test]
fn q8_0_weights_compute_as_their_dequantized_f32() {
    let tensors = tiny_tensors(true);
    let mut dense = BTreeMap::new();
    let mut stored: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = Vec::new();
    let mut quantized = 0;
    for (name, (shape, values)) in &tensors {
        let whole_blocks = shape.len() == 2 && shape[1] % spinkv_kernels::Q8_BLOCK == 0;
        if !whole_blocks {
            dense.insert(name.clone(), (shape.clone(), values.clone()));
            let (dtype, bytes) = encode(values, Store::F32);
            stored.push((name.clone(), shape.clone(), dtype, bytes));
            continue;
        }
        quantized += 1;
        let (codes, scales, dequantized) = quantize_q8(values);
        dense.insert(name.clone(), (shape.clone(), dequantized));
        let scale_shape = vec![shape[0], shape[1] / spinkv_kernels::Q8_BLOCK];
        stored.push((
            name.clone(),
            shape.clone(),
            Dtype::I8,
            bytemuck::cast_slice(&codes).to_vec(),
        ));
        stored.push((
            format!("{name}{}", crate::weights::Q8_SCALE_SUFFIX),
            scale_shape,
            Dtype::F16,
            bytemuck::cast_slice(&scales).to_vec(),
        ));
    }
    assert!(quantized >= 4, "the tiny model has q8_0-shaped matrices");
    let views = stored.iter().map(|(name, shape, dtype, bytes)| {
        (
            name.clone(),
            TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
        )
    });
    let q8_dir = TempDir::new();
    std::fs::write(q8_dir.0.join("config.json"), config_json(true)).unwrap();
    std::fs::write(
        q8_dir.0.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    let f32_dir = TempDir::new();
    write_model(&f32_dir.0, &dense, Store::F32, true);

    let q8 = Model::load(&q8_dir.0).unwrap();
    assert_eq!(q8.dtype(), WeightDtype::Q8_0);
    assert_eq!(inspect(&q8_dir.0).unwrap().dtype, "q8_0");
    let reference = Model::load(&f32_dir.0).unwrap();
    let tokens = prompt(40);
    let mut a = Session::new(q8, KvConfig::fp16()).unwrap();
    let mut b = Session::new(reference, KvConfig::fp16()).unwrap();
    let (prefill_q8, prefill_f32) = (
        a.prefill(&tokens, true).unwrap().unwrap(),
        b.prefill(&tokens, true).unwrap().unwrap(),
    );
    let error = relative_error(&prefill_q8, &prefill_f32);
    assert!(error < 5e-3, "prefill: relative error {error}");
    a.decode(7).unwrap();
    b.decode(7).unwrap();
    let error = relative_error(a.last_logits(), b.last_logits());
    assert!(error < 5e-3, "decode: relative error {error}");
}

#[test]
fn q8_0_without_its_scales_is_named() {
    let tensors = tiny_tensors(false);
    let mut stored: Vec<(String, Vec<usize>, Dtype, Vec<u8>)> = Vec::new();
    for (name, (shape, values)) in &tensors {
        if name == "model.embed_tokens.weight" {
            let (codes, _, _) = quantize_q8(values);
            stored.push((
                name.clone(),
                shape.clone(),
                Dtype::I8,
                bytemuck::cast_slice(&codes).to_vec(),
            ));
        } else {
            let (dtype, bytes) = encode(values, Store::F32);
            stored.push((name.clone(), shape.clone(), dtype, bytes));
        }
    }
    let views = stored.iter().map(|(name, shape, dtype, bytes)| {
        (
            name.clone(),
            TensorView::new(*dtype, shape.clone(), bytes).unwrap(),
        )
    });
    let dir = TempDir::new();
    std::fs::write(dir.0.join("config.json"), config_json(false)).unwrap();
    std::fs::write(
        dir.0.join("model.safetensors"),
        safetensors::serialize(views, None).unwrap(),
    )
    .unwrap();
    let err = Model::load(&dir.0).err().unwrap();
    assert!(
        err.to_string().contains("model.embed_tokens.weight_scale"),
        "{err}"
    );
    assert_eq!(
        assert_inspection_agrees_with_the_loader(&dir.0),
        Some(err.to_string())
    );
}
