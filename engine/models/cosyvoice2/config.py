"""Hyperparameters of a CosyVoice2 model directory, read from its HyperPyYAML file.

The released ``cosyvoice2.yaml`` names Python classes with ``!new:``/``!name:``/``!apply:`` tags and
cross-references values with ``!ref``. We never import or instantiate those classes: a SafeLoader
subclass turns every tagged node into plain data, ``!ref`` is resolved afterwards, and the numbers
we need are copied into small frozen dataclasses.
"""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


class ConfigError(ValueError):
    """The yaml lacks a key we need, or a value has an unexpected form."""


# --------------------------------------------------------------------------------------------
# HyperPyYAML -> plain data


@dataclass(frozen=True)
class _Ref:
    """A ``!ref`` expression, resolved once the whole document is loaded."""

    expr: str


class _HyperLoader(yaml.SafeLoader):
    pass


def _construct_tagged(
    loader: _HyperLoader, tag_suffix: str, node: yaml.ScalarNode | yaml.SequenceNode | yaml.MappingNode
) -> Any:
    # ``!new:pkg.Class`` / ``!name:pkg.func`` keep their arguments plus the target name, so the
    # caller can check which class a section describes; ``!apply:`` calls (seeding) are dropped.
    kind, _, target = tag_suffix.partition(":")
    if kind == "apply":
        return None
    if isinstance(node, yaml.MappingNode):
        value: Any = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = {"args": loader.construct_sequence(node, deep=True)}
    else:
        scalar = loader.construct_scalar(node)
        value = {} if scalar == "" else {"args": [scalar]}
    value["__target__"] = target
    return value


def _construct_ref(loader: _HyperLoader, node: yaml.ScalarNode) -> _Ref:  # ``!ref <name>``: a scalar
    return _Ref(str(loader.construct_scalar(node)))


_HyperLoader.add_multi_constructor("!", _construct_tagged)
_HyperLoader.add_constructor("!ref", _construct_ref)

_REF_NAME = re.compile(r"<([^<>]+)>")
_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _eval_arith(node: ast.AST) -> Any:
    # HyperPyYAML allows simple arithmetic in refs ("<chunk_size> * <token_mel_ratio>");
    # evaluate just that, never arbitrary Python.
    if isinstance(node, ast.Expression):
        return _eval_arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](_eval_arith(node.left), _eval_arith(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _eval_arith(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    raise ValueError(f"not arithmetic: {ast.dump(node)}")


def _lookup(root: dict[str, Any], name: str, stack: tuple[str, ...]) -> Any:
    node: Any = root
    for part in re.split(r"[./]", name):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"!ref <{name}> names no key in the yaml")
        node = node[part]
    return _resolve(root, node, (*stack, name))


def _resolve(root: dict[str, Any], node: Any, stack: tuple[str, ...] = ()) -> Any:
    if isinstance(node, _Ref):
        expr = node.expr.strip()
        names = _REF_NAME.findall(expr)
        if any(n in stack for n in names):
            raise ConfigError(f"circular !ref: {' -> '.join(stack + tuple(names))}")
        whole = _REF_NAME.fullmatch(expr)
        if whole:
            return _lookup(root, whole.group(1), stack)
        values = {n: _lookup(root, n, stack) for n in names}
        text = _REF_NAME.sub(lambda m: str(values[m.group(1)]), expr)
        try:
            return _eval_arith(ast.parse(text, mode="eval"))
        except (SyntaxError, ValueError):
            return text  # not arithmetic: a string built from refs, e.g. a path
    if isinstance(node, dict):
        return {k: _resolve(root, v, stack) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(root, v, stack) for v in node]
    return node


def load_hyperpyyaml_plain(path: str | Path) -> dict[str, Any]:
    """Load a HyperPyYAML file as plain dicts/lists/scalars with every ``!ref`` resolved."""
    with open(path, encoding="utf-8") as f:
        raw = yaml.load(f, Loader=_HyperLoader)  # a SafeLoader subclass: no arbitrary objects
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level is not a mapping")
    return _resolve(raw, raw)


# --------------------------------------------------------------------------------------------
# Dataclasses


@dataclass(frozen=True)
class SamplingConfig:
    top_p: float
    top_k: int
    win_size: int
    tau_r: float


@dataclass(frozen=True)
class LLMConfig:
    llm_input_size: int
    llm_output_size: int
    speech_token_size: int
    sampling: SamplingConfig


@dataclass(frozen=True)
class EncoderConfig:
    input_size: int
    output_size: int
    attention_heads: int
    linear_units: int
    num_blocks: int
    activation_type: str
    static_chunk_size: int
    key_bias: bool


@dataclass(frozen=True)
class EstimatorConfig:
    in_channels: int
    out_channels: int
    channels: tuple[int, ...]
    attention_head_dim: int
    n_blocks: int
    num_mid_blocks: int
    num_heads: int
    act_fn: str
    static_chunk_size: int


@dataclass(frozen=True)
class CFMConfig:
    t_scheduler: str
    inference_cfg_rate: float
    n_spks: int
    spk_emb_dim: int


@dataclass(frozen=True)
class FlowConfig:
    input_size: int
    output_size: int
    spk_embed_dim: int
    vocab_size: int
    input_frame_rate: int
    token_mel_ratio: int
    pre_lookahead_len: int
    encoder: EncoderConfig
    cfm: CFMConfig
    estimator: EstimatorConfig


@dataclass(frozen=True)
class HiFTConfig:
    in_channels: int
    base_channels: int
    nb_harmonics: int
    sampling_rate: int
    nsf_alpha: float
    nsf_sigma: float
    nsf_voiced_threshold: float
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    n_fft: int
    hop_len: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    source_resblock_kernel_sizes: tuple[int, ...]
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    lrelu_slope: float
    audio_limit: float
    f0_cond_channels: int

    @property
    def samples_per_frame(self) -> int:
        """Audio samples per mel frame: the product of the upsampling rates times the iSTFT hop."""
        n = self.hop_len
        for r in self.upsample_rates:
            n *= r
        return n


@dataclass(frozen=True)
class MelConfig:
    n_fft: int
    num_mels: int
    sampling_rate: int
    hop_size: int
    win_size: int
    fmin: float
    fmax: float
    center: bool


@dataclass(frozen=True)
class CosyVoice2Config:
    sample_rate: int
    token_frame_rate: int
    token_mel_ratio: int
    chunk_size: int
    llm: LLMConfig
    flow: FlowConfig
    hift: HiFTConfig
    mel: MelConfig


def _section(doc: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: missing section '{key}'")
    return value


def _get(doc: dict[str, Any], key: str, where: str, default: Any = ...) -> Any:
    if key in doc and doc[key] is not None:
        return doc[key]
    if default is ...:
        raise ConfigError(f"{where}: missing key '{key}'")
    return default


def _ints(values: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


# (key, reference constructor default, the value CosyVoice2 uses and we implement)
_ENCODER_VARIANTS = (
    ("input_layer", "conv2d", "linear"),
    ("pos_enc_layer_type", "rel_pos", "rel_pos_espnet"),
    ("selfattention_layer_type", "rel_selfattn", "rel_selfattn"),
    ("use_cnn_module", True, False),
    ("macaron_style", True, False),
    ("normalize_before", True, True),
)


def parse_config(doc: dict[str, Any]) -> CosyVoice2Config:
    """Pick the CosyVoice2 hyperparameters out of a resolved yaml document.

    Defaults are the reference classes' constructor defaults, used only when the yaml omits a key.
    """
    llm = _section(doc, "llm", "yaml")
    sampling = _section(llm, "sampling", "llm")
    llm_cfg = LLMConfig(
        llm_input_size=int(_get(llm, "llm_input_size", "llm")),
        llm_output_size=int(_get(llm, "llm_output_size", "llm")),
        speech_token_size=int(_get(llm, "speech_token_size", "llm")),
        sampling=SamplingConfig(
            top_p=float(_get(sampling, "top_p", "llm.sampling", 0.8)),
            top_k=int(_get(sampling, "top_k", "llm.sampling", 25)),
            win_size=int(_get(sampling, "win_size", "llm.sampling", 10)),
            tau_r=float(_get(sampling, "tau_r", "llm.sampling", 0.1)),
        ),
    )

    flow = _section(doc, "flow", "yaml")
    enc = _section(flow, "encoder", "flow")
    # The encoder classes take these with other defaults; we implement only CosyVoice2's choice.
    for key, default, supported in _ENCODER_VARIANTS:
        if enc.get(key, default) != supported:
            raise ConfigError(f"flow.encoder.{key}={enc.get(key, default)!r} is not supported (need {supported!r})")
    dec = _section(flow, "decoder", "flow")
    cfm_params = _section(dec, "cfm_params", "flow.decoder")
    cfm_params = cfm_params.get("content", cfm_params)  # wrapped in omegaconf.DictConfig
    est = _section(dec, "estimator", "flow.decoder")
    flow_cfg = FlowConfig(
        input_size=int(_get(flow, "input_size", "flow")),
        output_size=int(_get(flow, "output_size", "flow")),
        spk_embed_dim=int(_get(flow, "spk_embed_dim", "flow")),
        vocab_size=int(_get(flow, "vocab_size", "flow")),
        input_frame_rate=int(_get(flow, "input_frame_rate", "flow")),
        token_mel_ratio=int(_get(flow, "token_mel_ratio", "flow")),
        pre_lookahead_len=int(_get(flow, "pre_lookahead_len", "flow")),
        encoder=EncoderConfig(
            input_size=int(_get(enc, "input_size", "flow.encoder")),
            output_size=int(_get(enc, "output_size", "flow.encoder")),
            attention_heads=int(_get(enc, "attention_heads", "flow.encoder")),
            linear_units=int(_get(enc, "linear_units", "flow.encoder")),
            num_blocks=int(_get(enc, "num_blocks", "flow.encoder")),
            activation_type=str(_get(enc, "activation_type", "flow.encoder", "swish")),
            static_chunk_size=int(_get(enc, "static_chunk_size", "flow.encoder", 0)),
            key_bias=bool(_get(enc, "key_bias", "flow.encoder", True)),
        ),
        cfm=CFMConfig(
            t_scheduler=str(_get(cfm_params, "t_scheduler", "flow.decoder.cfm_params")),
            inference_cfg_rate=float(_get(cfm_params, "inference_cfg_rate", "flow.decoder.cfm_params")),
            n_spks=int(_get(dec, "n_spks", "flow.decoder", 1)),
            spk_emb_dim=int(_get(dec, "spk_emb_dim", "flow.decoder")),
        ),
        estimator=EstimatorConfig(
            in_channels=int(_get(est, "in_channels", "flow.decoder.estimator")),
            out_channels=int(_get(est, "out_channels", "flow.decoder.estimator")),
            channels=_ints(_get(est, "channels", "flow.decoder.estimator")),
            attention_head_dim=int(_get(est, "attention_head_dim", "flow.decoder.estimator")),
            n_blocks=int(_get(est, "n_blocks", "flow.decoder.estimator")),
            num_mid_blocks=int(_get(est, "num_mid_blocks", "flow.decoder.estimator")),
            num_heads=int(_get(est, "num_heads", "flow.decoder.estimator")),
            act_fn=str(_get(est, "act_fn", "flow.decoder.estimator")),
            static_chunk_size=int(_get(est, "static_chunk_size", "flow.decoder.estimator")),
        ),
    )

    hift = _section(doc, "hift", "yaml")
    istft = _section(hift, "istft_params", "hift")
    f0 = _section(hift, "f0_predictor", "hift")
    hift_cfg = HiFTConfig(
        in_channels=int(_get(hift, "in_channels", "hift")),
        base_channels=int(_get(hift, "base_channels", "hift")),
        nb_harmonics=int(_get(hift, "nb_harmonics", "hift")),
        sampling_rate=int(_get(hift, "sampling_rate", "hift")),
        nsf_alpha=float(_get(hift, "nsf_alpha", "hift")),
        nsf_sigma=float(_get(hift, "nsf_sigma", "hift")),
        nsf_voiced_threshold=float(_get(hift, "nsf_voiced_threshold", "hift")),
        upsample_rates=_ints(_get(hift, "upsample_rates", "hift")),
        upsample_kernel_sizes=_ints(_get(hift, "upsample_kernel_sizes", "hift")),
        n_fft=int(_get(istft, "n_fft", "hift.istft_params")),
        hop_len=int(_get(istft, "hop_len", "hift.istft_params")),
        resblock_kernel_sizes=_ints(_get(hift, "resblock_kernel_sizes", "hift")),
        resblock_dilation_sizes=tuple(_ints(d) for d in _get(hift, "resblock_dilation_sizes", "hift")),
        source_resblock_kernel_sizes=_ints(_get(hift, "source_resblock_kernel_sizes", "hift")),
        source_resblock_dilation_sizes=tuple(_ints(d) for d in _get(hift, "source_resblock_dilation_sizes", "hift")),
        lrelu_slope=float(_get(hift, "lrelu_slope", "hift", 0.1)),
        audio_limit=float(_get(hift, "audio_limit", "hift", 0.99)),
        f0_cond_channels=int(_get(f0, "cond_channels", "hift.f0_predictor")),
    )

    sample_rate = int(_get(doc, "sample_rate", "yaml"))
    token_frame_rate = int(_get(doc, "token_frame_rate", "yaml", flow_cfg.input_frame_rate))
    token_mel_ratio = int(_get(doc, "token_mel_ratio", "yaml", flow_cfg.token_mel_ratio))
    # The released yaml describes the prompt mel in ``feat_extractor``; a reduced yaml may omit it,
    # and then the mel is the one the flow was built around: one frame per 1/(frame rate * ratio) s,
    # a window of four hops, as many bins as the flow outputs, up to 8 kHz.
    feat_doc = doc.get("feat_extractor")
    feat: dict[str, Any] = feat_doc if isinstance(feat_doc, dict) else {}
    hop = int(_get(feat, "hop_size", "feat_extractor", sample_rate // (token_frame_rate * token_mel_ratio)))
    n_fft = int(_get(feat, "n_fft", "feat_extractor", 4 * hop))
    mel_cfg = MelConfig(
        n_fft=n_fft,
        num_mels=int(_get(feat, "num_mels", "feat_extractor", flow_cfg.output_size)),
        sampling_rate=int(_get(feat, "sampling_rate", "feat_extractor", sample_rate)),
        hop_size=hop,
        win_size=int(_get(feat, "win_size", "feat_extractor", n_fft)),
        fmin=float(_get(feat, "fmin", "feat_extractor", 0)),
        fmax=float(_get(feat, "fmax", "feat_extractor", 8000)),
        center=bool(_get(feat, "center", "feat_extractor", False)),
    )
    return CosyVoice2Config(
        sample_rate=sample_rate,
        token_frame_rate=token_frame_rate,
        token_mel_ratio=token_mel_ratio,
        chunk_size=int(_get(doc, "chunk_size", "yaml", flow_cfg.encoder.static_chunk_size)),
        llm=llm_cfg,
        flow=flow_cfg,
        hift=hift_cfg,
        mel=mel_cfg,
    )


def load_config(path: str | Path) -> CosyVoice2Config:
    """Read ``cosyvoice2.yaml`` into a :class:`CosyVoice2Config`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"CosyVoice2 config not found: {path}")
    try:
        return parse_config(load_hyperpyyaml_plain(path))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e
