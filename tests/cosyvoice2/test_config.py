"""Reading HyperPyYAML without instantiating anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cosyvoice2.deps import require

require("yaml")

from rtvoice.engine.models.cosyvoice2.config import ConfigError, load_config, load_hyperpyyaml_plain  # noqa: E402

YAML = """
__seed: !apply:torch.manual_seed [1986]
sample_rate: 24000
chunk_size: 25
ratio: 2
path: 'models'
block: !new:some.module.Class
    size: !ref <chunk_size> * <ratio>
    rate: !ref <sample_rate>
    nested: !name:other.func
        where: !ref <path>/sub
        neg: !ref -<ratio> + 1
"""


def test_tags_become_plain_data(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(YAML)
    doc = load_hyperpyyaml_plain(f)
    assert doc["__seed"] is None  # !apply: calls are never made
    block = doc["block"]
    assert block["__target__"] == "some.module.Class"
    assert block["size"] == 50 and block["rate"] == 24000
    assert block["nested"] == {"where": "models/sub", "neg": -1, "__target__": "other.func"}


def test_bad_ref(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("a: !ref <missing>\n")
    with pytest.raises(ConfigError, match="missing"):
        load_hyperpyyaml_plain(f)


def test_fixture_config(model_dir: Path) -> None:
    cfg = load_config(model_dir / "cosyvoice2.yaml")
    # values tied together by !ref arithmetic in the yaml
    assert cfg.flow.estimator.static_chunk_size == cfg.chunk_size * cfg.token_mel_ratio
    assert cfg.hift.sampling_rate == cfg.sample_rate
    assert cfg.mel.hop_size * cfg.token_frame_rate * cfg.token_mel_ratio == cfg.sample_rate


def test_missing_config(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"cosyvoice2\.yaml"):
        load_config(tmp_path / "cosyvoice2.yaml")
