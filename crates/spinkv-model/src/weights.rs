//! Safetensors weights, validated against the config before any forward: memory-mapped files
//! natively, or bytes a host handed over ([`WeightBytes`]: a browser has no files to map).
//!
//! Large matrices stay in the mapping (or the byte buffer) in their stored dtype
//! (f16/bf16/f32, or Q8_0: an I8 tensor `NAME` with its F16 scales `NAME_scale` of shape
//! `[rows, cols / 32]`); kernels widen them in registers. Only the small 1-D norm weights are
//! converted to owned f32.

use crate::config::LlamaConfig;
use crate::error::ModelError;
use half::{bf16, f16};
#[cfg(not(target_arch = "wasm32"))]
use memmap2::{Mmap, MmapOptions};
use safetensors::{Dtype, SafeTensors};
use spinkv_kernels::{Q8Weights, WeightDtype, WeightRef, Q8_BLOCK};
use std::collections::{BTreeSet, HashMap};
use std::ops::Deref;
use std::path::{Path, PathBuf};

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";

/// A 2-D weight matrix `[rows, cols]` inside one of the mapped files.
#[derive(Clone, Debug)]
pub(crate) struct Matrix {
    pub rows: usize,
    pub cols: usize,
    dtype: WeightDtype,
    storage: Storage,
    /// Q8_0 only: the f16 scales (`[rows, cols / Q8_BLOCK]`).
    scales: Option<Storage>,
}

#[derive(Clone, Debug)]
enum Storage {
    /// Byte range inside `Weights::shards[shard]`, aligned for `dtype` (checked at load).
    Mapped {
        shard: usize,
        start: usize,
        end: usize,
    },
    /// Fallback for a tensor whose offset is not aligned for its dtype (legal in safetensors,
    /// never produced by the usual writers): copied once into aligned memory.
    Owned(OwnedData),
}

#[derive(Clone, Debug)]
enum OwnedData {
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
    F32(Vec<f32>),
    I8(Vec<i8>),
}

/// Suffix of the tensor holding a Q8_0 matrix's scales.
pub const Q8_SCALE_SUFFIX: &str = "_scale";

pub(crate) struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub q_proj: Matrix,
    pub k_proj: Matrix,
    pub v_proj: Matrix,
    pub o_proj: Matrix,
    pub mlp_norm: Vec<f32>,
    pub gate_proj: Matrix,
    pub up_proj: Matrix,
    pub down_proj: Matrix,
    /// What other families add (all `None`/empty for Llama): see [`LayerExtras`].
    pub extras: LayerExtras,
}

/// Per-layer tensors beyond Llama's, present as the config's family asks. Gemma's norm gains
/// are stored here (and in `attn_norm`, `mlp_norm`, `final_norm`) as `1 + w`, the gain they apply.
#[derive(Default)]
pub(crate) struct LayerExtras {
    pub q_bias: Option<Vec<f32>>,
    pub k_bias: Option<Vec<f32>>,
    pub v_bias: Option<Vec<f32>>,
    pub o_bias: Option<Vec<f32>>,
    /// `[head_dim]` RMSNorm gains of every query / key head (Qwen3, Gemma 3).
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    /// Gemma: norms of the attention output and of the MLP output, before their residual adds.
    pub post_attn_norm: Option<Vec<f32>>,
    pub post_mlp_norm: Option<Vec<f32>>,
}

/// An owned byte buffer, 8-byte aligned so that f16/bf16/f32 tensors inside a safetensors file
/// (whose data starts 8-byte aligned) are used in place, as from a memory map. A host fills it
/// through [`WeightBytes::as_mut_bytes`] (a browser streams a download straight into it).
pub struct WeightBytes {
    words: Vec<u64>,
    len: usize,
}

impl WeightBytes {
    /// `len` zero bytes; an allocation the platform refuses is an error, not an abort.
    pub fn zeroed(len: usize) -> Result<WeightBytes, ModelError> {
        let n_words = len.div_ceil(8);
        let mut words = Vec::new();
        words.try_reserve_exact(n_words).map_err(|_| {
            ModelError::TooLarge(format!("{len} bytes of weights do not fit in memory"))
        })?;
        words.resize(n_words, 0);
        Ok(WeightBytes { words, len })
    }

    /// A copy of `bytes`.
    pub fn copy_from(bytes: &[u8]) -> Result<WeightBytes, ModelError> {
        let mut out = WeightBytes::zeroed(bytes.len())?;
        out.as_mut_bytes().copy_from_slice(bytes);
        Ok(out)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }

    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

/// One safetensors file's bytes.
enum Shard {
    /// Read into anonymous memory ([`read_to_huge_pages`]), or an empty file's map.
    #[cfg(not(target_arch = "wasm32"))]
    Mapped(Mmap),
    Bytes(WeightBytes),
}

impl Deref for Shard {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            Shard::Mapped(map) => map,
            Shard::Bytes(bytes) => bytes.as_bytes(),
        }
    }
}

/// A weight file's bytes in anonymous memory that the kernel may back with 2 MiB pages.
///
/// Why not map the file: decode reads every weight once per token, and through 4 KiB page-cache
/// pages that is ~65k TLB misses per token for SmolLM2-135M's 269 MB. With transparent huge
/// pages (Linux; `madvise` mode is the common default) the same reads ran ~12 % faster on an
/// AMD EPYC Zen 4 (decode at depth 512, median of 4 interleaved pairs). The price is paid at
/// load: faulting in and zeroing 2 MiB pages (and compacting memory for them when it is
/// fragmented) took 0.2–0.7 s for SmolLM2-135M, against ~30 ms for the populated file map.
/// Where the kernel has no huge pages the advice is a no-op.
#[cfg(not(target_arch = "wasm32"))]
fn read_to_huge_pages(file: &std::fs::File) -> std::io::Result<Mmap> {
    use std::io::{Read, Seek, SeekFrom};
    let len = usize::try_from(file.metadata()?.len())
        .map_err(|_| std::io::Error::other("file larger than the address space"))?;
    if len == 0 {
        // An empty map (the safetensors parser names what is missing); map_anon needs a length.
        // SAFETY: a read-only map of an empty file: there are no bytes to change under us.
        return unsafe { MmapOptions::new().map(file) };
    }
    let mut memory = spinkv_kv::huge_pages::map_anonymous(len)?;
    let mut reader = file;
    reader.seek(SeekFrom::Start(0))?; // `read_header` has read past the start
    reader.read_exact(&mut memory[..len])?;
    let mut tail = [0u8; 1];
    if reader.read(&mut tail)? != 0 {
        return Err(std::io::Error::other("the file grew while it was read"));
    }
    memory.make_read_only()
}

/// A safetensors file's header: where its data starts (8 + the header's length) and the
/// tensors it describes.
pub(crate) struct Header {
    pub data_start: usize,
    pub metadata: safetensors::tensor::Metadata,
}

/// Why [`read_header`] refused a safetensors file.
pub(crate) enum HeaderError {
    Io(std::io::Error),
    Invalid(String),
    /// A tensor whose dtype the safetensors format does not define.
    UnknownDtype {
        tensor: String,
        dtype: String,
    },
}

/// The largest header the safetensors parser accepts.
const MAX_HEADER_BYTES: u64 = 100_000_000;

/// A safetensors file's header, parsed by the safetensors crate's own rules (known dtypes,
/// offsets that tile the data, shapes that match them) and checked against the file's length,
/// reading nothing past the header. The loader reads the whole file into memory next: a header
/// that describes a few KB at the head of a file of gigabytes (a sparse one costs nothing on
/// disk) would otherwise be read whole before the parser noticed. `spinkv models info` reads
/// the same header the same way, so what it shows is what would load.
pub(crate) fn read_header(mut file: &std::fs::File) -> Result<Header, HeaderError> {
    use std::io::{Read, Seek, SeekFrom};
    let len = file.metadata().map_err(HeaderError::Io)?.len();
    file.seek(SeekFrom::Start(0)).map_err(HeaderError::Io)?;
    if len < 8 {
        return Err(HeaderError::Invalid(format!(
            "a {len}-byte file has no safetensors header"
        )));
    }
    let mut word = [0u8; 8];
    file.read_exact(&mut word).map_err(HeaderError::Io)?;
    let header_len = u64::from_le_bytes(word);
    if header_len > MAX_HEADER_BYTES || header_len > len - 8 {
        return Err(HeaderError::Invalid(format!(
            "its header length {header_len} does not fit the file's {len} bytes"
        )));
    }
    let mut header = vec![0u8; header_len as usize];
    file.read_exact(&mut header).map_err(HeaderError::Io)?;
    let metadata: safetensors::tensor::Metadata =
        serde_json::from_slice(&header).map_err(|e| match unknown_dtype(&header) {
            Some((tensor, dtype)) => HeaderError::UnknownDtype { tensor, dtype },
            None => HeaderError::Invalid(format!("its header is not valid: {e}")),
        })?;
    let described = 8 + header_len + metadata.data_len() as u64;
    if described != len {
        return Err(HeaderError::Invalid(format!(
            "the file is {len} bytes but its header describes {described}"
        )));
    }
    Ok(Header {
        data_start: 8 + header_len as usize,
        metadata,
    })
}

/// A [`HeaderError`] of the file at `path` as the loader reports it.
pub(crate) fn header_error(path: &Path, error: HeaderError) -> ModelError {
    match error {
        HeaderError::Io(source) => ModelError::Io {
            path: path.to_path_buf(),
            source,
        },
        HeaderError::Invalid(reason) => ModelError::Safetensors {
            path: path.to_path_buf(),
            reason,
        },
        HeaderError::UnknownDtype { tensor, dtype } => ModelError::UnsupportedDtype {
            name: tensor,
            file: file_name(path),
            dtype,
        },
    }
}

/// The first tensor (by name) of a safetensors header's JSON whose dtype the format does not
/// define, with that dtype as written. serde's own error for it lists every dtype the format
/// knows, most of which the loader does not read either.
fn unknown_dtype(header_json: &[u8]) -> Option<(String, String)> {
    let entries: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(header_json).ok()?;
    entries
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .find_map(|(name, entry)| {
            let dtype = entry.get("dtype")?;
            let known = serde_json::from_value::<Dtype>(dtype.clone()).is_ok();
            let shown = dtype
                .as_str()
                .map_or_else(|| dtype.to_string(), str::to_string);
            (!known).then_some((name, shown))
        })
}

/// The header JSON of a safetensors file's bytes (empty when its length word does not fit).
fn header_json(bytes: &[u8]) -> &[u8] {
    let declared = bytes
        .get(..8)
        .and_then(|word| word.try_into().ok())
        .map(u64::from_le_bytes)
        .and_then(|len| usize::try_from(len).ok());
    declared
        .and_then(|len| bytes.get(8..len.checked_add(8)?))
        .unwrap_or_default()
}

pub(crate) struct Weights {
    shards: Vec<Shard>,
    pub embed_tokens: Matrix,
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>,
    /// `None` when tied to `embed_tokens`.
    lm_head: Option<Matrix>,
    /// Bytes of all mapped files.
    pub file_bytes: u64,
    pub dtype: WeightDtype,
}

impl Weights {
    pub fn view<'a>(&'a self, m: &'a Matrix) -> WeightRef<'a> {
        // Alignment and length were verified when the Matrix was built, so the casts cannot
        // fail; the fallback keeps that an invariant rather than a panic site.
        let cast_failed = "weight alignment verified at load";
        if let Some(scales) = &m.scales {
            let codes: &[i8] = match &m.storage {
                Storage::Owned(OwnedData::I8(v)) => v,
                other => bytemuck::cast_slice(self.bytes(other)),
            };
            let scales: &[f16] = match scales {
                Storage::Owned(OwnedData::F16(v)) => v,
                other => bytemuck::try_cast_slice(self.bytes(other)).expect(cast_failed),
            };
            let q8 = Q8Weights::new(codes, scales).expect("q8_0 scale count verified at load");
            return WeightRef::Q8_0(q8);
        }
        match &m.storage {
            Storage::Owned(OwnedData::F16(v)) => WeightRef::F16(v),
            Storage::Owned(OwnedData::Bf16(v)) => WeightRef::Bf16(v),
            Storage::Owned(OwnedData::F32(v)) => WeightRef::F32(v),
            Storage::Owned(OwnedData::I8(_)) | Storage::Mapped { .. } => {
                let bytes = self.bytes(&m.storage);
                match m.dtype {
                    WeightDtype::F16 => {
                        WeightRef::F16(bytemuck::try_cast_slice(bytes).expect(cast_failed))
                    }
                    WeightDtype::Bf16 => {
                        WeightRef::Bf16(bytemuck::try_cast_slice(bytes).expect(cast_failed))
                    }
                    WeightDtype::F32 | WeightDtype::Q8_0 => {
                        WeightRef::F32(bytemuck::try_cast_slice(bytes).expect(cast_failed))
                    }
                }
            }
        }
    }

    /// The mapped bytes of `storage` (empty for owned data, which callers read directly).
    fn bytes(&self, storage: &Storage) -> &[u8] {
        match storage {
            Storage::Mapped { shard, start, end } => &self.shards[*shard][*start..*end],
            Storage::Owned(_) => &[],
        }
    }

    pub fn lm_head(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed_tokens)
    }

    #[cfg(not(target_arch = "wasm32"))]
    pub fn load(dir: &Path, config: &LlamaConfig) -> Result<Weights, ModelError> {
        let files = weight_files(dir)?;
        let mut shards = Vec::with_capacity(files.len());
        for path in &files {
            let file = std::fs::File::open(path).map_err(|source| ModelError::Io {
                path: path.clone(),
                source,
            })?;
            read_header(&file).map_err(|reason| header_error(path, reason))?;
            let map = read_to_huge_pages(&file).map_err(|source| ModelError::Io {
                path: path.clone(),
                source,
            })?;
            shards.push(Shard::Mapped(map));
        }
        Self::from_shards(dir, files, shards, config)
    }

    /// Weights from safetensors files already in memory, `(name, bytes)` in the loader's order
    /// (one file, or the shards sorted by name); `origin` names the model in errors.
    pub fn from_bytes(
        origin: &Path,
        files: Vec<(String, WeightBytes)>,
        config: &LlamaConfig,
    ) -> Result<Weights, ModelError> {
        if files.is_empty() {
            return Err(ModelError::NoWeights(origin.to_path_buf()));
        }
        let (names, shards) = files
            .into_iter()
            .map(|(name, bytes)| (origin.join(name), Shard::Bytes(bytes)))
            .unzip();
        Self::from_shards(origin, names, shards, config)
    }

    fn from_shards(
        dir: &Path,
        files: Vec<PathBuf>,
        shards: Vec<Shard>,
        config: &LlamaConfig,
    ) -> Result<Weights, ModelError> {
        let mut index: HashMap<String, TensorLocation> = HashMap::new();
        let mut file_bytes = 0;
        for (shard, (path, map)) in files.iter().zip(&shards).enumerate() {
            file_bytes += map.len() as u64;
            let (header_len, metadata) = SafeTensors::read_metadata(map).map_err(|e| {
                match unknown_dtype(header_json(map)) {
                    Some((tensor, dtype)) => {
                        header_error(path, HeaderError::UnknownDtype { tensor, dtype })
                    }
                    None => ModelError::Safetensors {
                        path: path.clone(),
                        reason: format!("{e:?}"),
                    },
                }
            })?;
            let header = Header {
                data_start: 8 + header_len,
                metadata,
            };
            index_tensors(&mut index, shard, path, &header, map.len())?;
        }
        let loader = Loader {
            shards: Some(&shards),
            files: &files,
            index: &index,
        };
        let tensors = loader.tensors(dir, config)?;
        let dtype = tensors.embed_tokens.dtype;
        Ok(Weights {
            shards,
            embed_tokens: tensors.embed_tokens,
            layers: tensors.layers,
            final_norm: tensors.final_norm,
            lm_head: tensors.lm_head,
            file_bytes,
            dtype,
        })
    }
}

/// Checks, from the safetensors headers alone, that the weights hold every tensor `config`
/// needs in a shape and dtype the loader takes (Q8_0 matrices with their scales): the loader's
/// own walk over the tensors ([`Loader::tensors`]) with no tensor data read. `files` and
/// `headers` are the model's weight files in load order ([`weight_files`]) and their headers
/// ([`read_header`]). Ok means the weights would load; the error is the one `Model::load`
/// would return first.
pub(crate) fn check_tensors(
    dir: &Path,
    config: &LlamaConfig,
    files: &[PathBuf],
    headers: &[Header],
) -> Result<(), ModelError> {
    let mut index: HashMap<String, TensorLocation> = HashMap::new();
    for (shard, (path, header)) in files.iter().zip(headers).enumerate() {
        // read_header has checked that the file is exactly this long.
        let file_len = header.data_start + header.metadata.data_len();
        index_tensors(&mut index, shard, path, header, file_len)?;
    }
    let loader = Loader {
        shards: None,
        files,
        index: &index,
    };
    loader.tensors(dir, config).map(drop)
}

/// Adds the tensors of one file's header to `index`, their byte ranges checked against the
/// file's length.
fn index_tensors(
    index: &mut HashMap<String, TensorLocation>,
    shard: usize,
    path: &Path,
    header: &Header,
    file_len: usize,
) -> Result<(), ModelError> {
    let corrupt = |reason: String| ModelError::Safetensors {
        path: path.to_path_buf(),
        reason,
    };
    for (name, info) in header.metadata.tensors() {
        let (begin, end) = info.data_offsets;
        let start = header
            .data_start
            .checked_add(begin)
            .ok_or_else(|| corrupt(format!("offset overflow in {name}")))?;
        let stop = header
            .data_start
            .checked_add(end)
            .ok_or_else(|| corrupt(format!("offset overflow in {name}")))?;
        if stop > file_len || start > stop {
            return Err(corrupt(format!("tensor {name} lies outside the file")));
        }
        index.insert(
            name,
            TensorLocation {
                shard,
                start,
                end: stop,
                dtype: info.dtype,
                shape: info.shape.clone(),
            },
        );
    }
    Ok(())
}

/// Every tensor the forward reads, as [`Loader::tensors`] finds them.
struct Tensors {
    embed_tokens: Matrix,
    layers: Vec<LayerWeights>,
    final_norm: Vec<f32>,
    lm_head: Option<Matrix>,
}

struct TensorLocation {
    shard: usize,
    start: usize,
    end: usize,
    dtype: Dtype,
    shape: Vec<usize>,
}

struct Loader<'a> {
    /// The files' bytes; `None` for a check from the headers alone ([`check_tensors`]): every
    /// tensor is located and checked, none is read (norm gains come back empty).
    shards: Option<&'a [Shard]>,
    files: &'a [PathBuf],
    index: &'a HashMap<String, TensorLocation>,
}

impl Loader<'_> {
    /// The one list of the tensors a model needs: which ones `config` asks for, in which
    /// shapes. The loader builds its weights with it, and `check_tensors` checks a model's
    /// headers with it.
    fn tensors(&self, dir: &Path, config: &LlamaConfig) -> Result<Tensors, ModelError> {
        let (h, m, v) = (
            config.hidden_size,
            config.intermediate_size,
            config.vocab_size,
        );
        let (q, kv) = (config.q_width(), config.kv_width());
        let embed_tokens = self.matrix("model.embed_tokens.weight", v, h)?;
        // Before the per-layer Vec: its capacity comes from config.json, which may claim
        // billions of layers; the weights present are the truth.
        check_layer_count(dir, self.index, config.num_hidden_layers)?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        // Gemma stores norm gains as w and applies 1 + w.
        let norm_offset = if config.gemma_norms { 1.0 } else { 0.0 };
        let norm = |name: &str, len: usize| -> Result<Vec<f32>, ModelError> {
            let mut gains = self.vector(name, len)?;
            gains.iter_mut().for_each(|g| *g += norm_offset);
            Ok(gains)
        };
        // Gemma's post_attention_layernorm follows attention; its MLP's input norm is
        // pre_feedforward_layernorm. Llama's post_attention_layernorm is the MLP's input norm.
        let mlp_norm_name = if config.gemma_norms {
            "pre_feedforward_layernorm"
        } else {
            "post_attention_layernorm"
        };
        let d = config.head_dim;
        for i in 0..config.num_hidden_layers {
            let p = format!("model.layers.{i}");
            let optional = |present: bool, name: &str, len: usize| {
                present
                    .then(|| self.vector(&format!("{p}.{name}"), len))
                    .transpose()
            };
            let optional_norm = |present: bool, name: &str, len: usize| {
                present
                    .then(|| norm(&format!("{p}.{name}"), len))
                    .transpose()
            };
            let extras = LayerExtras {
                q_bias: optional(config.qkv_bias, "self_attn.q_proj.bias", q)?,
                k_bias: optional(config.qkv_bias, "self_attn.k_proj.bias", kv)?,
                v_bias: optional(config.qkv_bias, "self_attn.v_proj.bias", kv)?,
                o_bias: optional(config.o_bias, "self_attn.o_proj.bias", h)?,
                q_norm: optional_norm(config.qk_norm, "self_attn.q_norm.weight", d)?,
                k_norm: optional_norm(config.qk_norm, "self_attn.k_norm.weight", d)?,
                post_attn_norm: optional_norm(
                    config.gemma_norms,
                    "post_attention_layernorm.weight",
                    h,
                )?,
                post_mlp_norm: optional_norm(
                    config.gemma_norms,
                    "post_feedforward_layernorm.weight",
                    h,
                )?,
            };
            layers.push(LayerWeights {
                attn_norm: norm(&format!("{p}.input_layernorm.weight"), h)?,
                q_proj: self.matrix(&format!("{p}.self_attn.q_proj.weight"), q, h)?,
                k_proj: self.matrix(&format!("{p}.self_attn.k_proj.weight"), kv, h)?,
                v_proj: self.matrix(&format!("{p}.self_attn.v_proj.weight"), kv, h)?,
                o_proj: self.matrix(&format!("{p}.self_attn.o_proj.weight"), h, q)?,
                mlp_norm: norm(&format!("{p}.{mlp_norm_name}.weight"), h)?,
                gate_proj: self.matrix(&format!("{p}.mlp.gate_proj.weight"), m, h)?,
                up_proj: self.matrix(&format!("{p}.mlp.up_proj.weight"), m, h)?,
                down_proj: self.matrix(&format!("{p}.mlp.down_proj.weight"), h, m)?,
                extras,
            });
        }
        let final_norm = norm("model.norm.weight", h)?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(self.matrix("lm_head.weight", v, h)?)
        };
        Ok(Tensors {
            embed_tokens,
            layers,
            final_norm,
            lm_head,
        })
    }

    fn locate(
        &self,
        name: &str,
        expected: &[usize],
    ) -> Result<(&TensorLocation, WeightDtype), ModelError> {
        let loc = self
            .index
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })?;
        let file = file_name(&self.files[loc.shard]);
        let dtype = match loc.dtype {
            Dtype::F16 => WeightDtype::F16,
            Dtype::BF16 => WeightDtype::Bf16,
            Dtype::F32 => WeightDtype::F32,
            Dtype::I8 => WeightDtype::Q8_0,
            other => {
                return Err(ModelError::UnsupportedDtype {
                    name: name.to_string(),
                    file,
                    dtype: format!("{other:?}"),
                })
            }
        };
        if loc.shape != expected {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                file,
                expected: expected.to_vec(),
                got: loc.shape.clone(),
            });
        }
        let bytes = expected
            .iter()
            .try_fold(dtype.size_bytes(), |n, &d| n.checked_mul(d));
        if bytes != Some(loc.end - loc.start) {
            return Err(ModelError::Safetensors {
                path: self.files[loc.shard].clone(),
                reason: format!(
                    "tensor {name} has {} bytes for shape {expected:?}",
                    loc.end - loc.start
                ),
            });
        }
        Ok((loc, dtype))
    }

    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix, ModelError> {
        let (loc, dtype) = self.locate(name, &[rows, cols])?;
        let storage = self.storage(loc, dtype);
        let scales = if dtype == WeightDtype::Q8_0 {
            let scale_name = format!("{name}{Q8_SCALE_SUFFIX}");
            if !cols.is_multiple_of(Q8_BLOCK) {
                return Err(ModelError::Safetensors {
                    path: self.files[loc.shard].clone(),
                    reason: format!(
                        "q8_0 tensor {name} has rows of {cols}, not whole blocks of {Q8_BLOCK}"
                    ),
                });
            }
            let (scale_loc, scale_dtype) = self.locate(&scale_name, &[rows, cols / Q8_BLOCK])?;
            if scale_dtype != WeightDtype::F16 {
                return Err(ModelError::Safetensors {
                    path: self.files[scale_loc.shard].clone(),
                    reason: format!(
                        "q8_0 scales {scale_name} have dtype {}; Q8_0 scales are F16",
                        scale_dtype.name()
                    ),
                });
            }
            Some(self.storage(scale_loc, scale_dtype))
        } else {
            None
        };
        Ok(Matrix {
            rows,
            cols,
            dtype,
            storage,
            scales,
        })
    }

    fn storage(&self, loc: &TensorLocation, dtype: WeightDtype) -> Storage {
        let mapped = Storage::Mapped {
            shard: loc.shard,
            start: loc.start,
            end: loc.end,
        };
        let Some(shards) = self.shards else {
            return mapped; // a check: never viewed
        };
        let bytes = &shards[loc.shard][loc.start..loc.end];
        let aligned = (bytes.as_ptr() as usize).is_multiple_of(dtype.size_bytes());
        if aligned {
            return mapped;
        }
        Storage::Owned(match dtype {
            WeightDtype::F16 => OwnedData::F16(bytemuck::pod_collect_to_vec(bytes)),
            WeightDtype::Bf16 => OwnedData::Bf16(bytemuck::pod_collect_to_vec(bytes)),
            WeightDtype::F32 => OwnedData::F32(bytemuck::pod_collect_to_vec(bytes)),
            WeightDtype::Q8_0 => OwnedData::I8(bytemuck::pod_collect_to_vec(bytes)),
        })
    }

    /// A 1-D weight (norm gains), widened to f32.
    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
        let (loc, dtype) = self.locate(name, &[len])?;
        let bytes = match self.shards {
            Some(shards) => &shards[loc.shard][loc.start..loc.end],
            None => &[], // a check: nothing read
        };
        Ok(match dtype {
            WeightDtype::F16 => bytemuck::pod_collect_to_vec::<u8, f16>(bytes)
                .iter()
                .map(|v| v.to_f32())
                .collect(),
            WeightDtype::Bf16 => bytemuck::pod_collect_to_vec::<u8, bf16>(bytes)
                .iter()
                .map(|v| v.to_f32())
                .collect(),
            WeightDtype::F32 => bytemuck::pod_collect_to_vec::<u8, f32>(bytes),
            WeightDtype::Q8_0 => {
                return Err(ModelError::UnsupportedDtype {
                    name: name.to_string(),
                    file: file_name(&self.files[loc.shard]),
                    dtype: "I8 (only matrices may be q8_0)".to_string(),
                })
            }
        })
    }
}

/// The layer indices N of the `model.layers.N.*` tensors must be exactly 0..num_hidden_layers.
fn check_layer_count(
    dir: &Path,
    index: &HashMap<String, TensorLocation>,
    num_hidden_layers: usize,
) -> Result<(), ModelError> {
    let layers: BTreeSet<usize> = index
        .keys()
        .filter_map(|name| name.strip_prefix("model.layers."))
        .filter_map(|rest| rest.split('.').next()?.parse().ok())
        .collect();
    let contiguous = layers.last().map_or(0, |last| last + 1) == layers.len();
    if layers.len() == num_hidden_layers && contiguous {
        return Ok(());
    }
    let found = match (layers.first(), layers.last()) {
        (Some(first), Some(last)) if contiguous => format!(
            "{} layers (model.layers.{first} to model.layers.{last})",
            layers.len()
        ),
        (Some(_), Some(_)) => format!(
            "layers numbered {:?}, not 0 to N-1",
            layers.iter().take(8).collect::<Vec<_>>()
        ),
        _ => "no layers".to_string(),
    };
    Err(ModelError::Config {
        path: dir.join("config.json"),
        reason: format!("num_hidden_layers is {num_hidden_layers}, but the weights hold {found}"),
    })
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// model.safetensors, or the shards named by model.safetensors.index.json (in sorted order):
/// the one rule for which files a model is, shared by the loader and `inspect`.
pub(crate) fn weight_files(dir: &Path) -> Result<Vec<PathBuf>, ModelError> {
    let single = dir.join(SINGLE_FILE);
    if single.is_file() {
        return Ok(vec![single]);
    }
    let index_path = dir.join(INDEX_FILE);
    for path in [&single, &index_path] {
        // A directory (or FIFO...) by that name is a broken model, not a missing file.
        if path.exists() && !path.is_file() {
            return Err(ModelError::Safetensors {
                path: path.clone(),
                reason: "not a regular file".into(),
            });
        }
    }
    if !index_path.is_file() {
        return Err(ModelError::NoWeights(dir.to_path_buf()));
    }
    let bad = |reason: String| ModelError::Index {
        path: index_path.clone(),
        reason,
    };
    let text = std::fs::read_to_string(&index_path).map_err(|source| ModelError::Io {
        path: index_path.clone(),
        source,
    })?;
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no weight_map object".into()))?;
    let mut shard_names = BTreeSet::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map[{tensor:?}] is not a file name")))?;
        // Shards must sit beside the index: no path components.
        if file.contains('/') || file.contains('\\') || file == ".." {
            return Err(bad(format!("shard name {file:?} is not a plain file name")));
        }
        shard_names.insert(file.to_string());
    }
    if shard_names.is_empty() {
        return Err(bad("weight_map is empty".into()));
    }
    let files: Vec<PathBuf> = shard_names.into_iter().map(|f| dir.join(f)).collect();
    if let Some(missing) = files.iter().find(|f| !f.is_file()) {
        return Err(ModelError::MissingShard {
            index: index_path.clone(),
            shard: missing.clone(),
        });
    }
    Ok(files)
}
