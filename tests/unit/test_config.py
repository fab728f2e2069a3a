from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mtkit.core.config import (
    Config,
    ConfigError,
    CorpusConfig,
    config_from_dict,
    config_to_dict,
    dump_config,
    load_config,
    save_config,
)

ROOT = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def test_typo_names_file_key_and_nearest_valid_key(tmp_path):
    path = write(tmp_path, "model:\n  dmodel: 512\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}: model.dmodel is not a key; did you mean model.d_model?"


def test_unknown_section_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match=r"trian is not a key; did you mean train\?"):
        load_config(write(tmp_path, "trian: {lr: 0.1}\n"))


def test_unknown_key_without_close_match_lists_valid_keys(tmp_path):
    with pytest.raises(ConfigError, match=r"decode.zzz is not a key; valid keys: decode.beam"):
        load_config(write(tmp_path, "decode: {zzz: 1}\n"))


def test_wrong_type_names_key_and_expected_type(tmp_path):
    with pytest.raises(ConfigError, match=r"model.d_model must be an integer, got 'big'"):
        load_config(write(tmp_path, "model: {d_model: big}\n"))
    with pytest.raises(ConfigError, match=r"model.share_embeddings must be true or false"):
        load_config(write(tmp_path, "model: {share_embeddings: 3}\n"))
    with pytest.raises(ConfigError, match=r"model.norm must be one of 'post', 'pre'"):
        load_config(write(tmp_path, "model: {norm: middle}\n"))


def test_out_of_range_value_is_rejected(tmp_path):
    with pytest.raises(ConfigError, match=r"model.dropout must be in \[0.0, 0.9\], got 1.5"):
        load_config(write(tmp_path, "model: {dropout: 1.5}\n"))
    with pytest.raises(ConfigError, match=r"train.lr must be in \(0.0, 10.0\]"):
        load_config(write(tmp_path, "train: {lr: 0}\n"))


def test_heads_must_divide_d_model(tmp_path):
    with pytest.raises(ConfigError, match=r"d_model \(10\) must be divisible by model.heads"):
        load_config(write(tmp_path, "model: {d_model: 10, heads: 4}\n"))


def test_overrides_convert_types_and_use_the_same_validator(tmp_path):
    path = write(tmp_path, "model: {d_model: 256}\n")
    cfg = load_config(
        path,
        [
            "model.d_model=512",
            "train.lr=3e-4",
            "model.norm=pre",
            "data.dedup=true",
            "run_dir=runs/x",
        ],
    )
    assert cfg.model.d_model == 512
    assert cfg.train.lr == pytest.approx(3e-4)
    assert cfg.model.norm == "pre" and cfg.data.dedup is True and cfg.run_dir == "runs/x"
    with pytest.raises(ConfigError, match=r"model.d_modle is not a key; did you mean model.d_"):
        load_config(path, ["model.d_modle=1"])
    with pytest.raises(ConfigError, match=r"expected section.key=value"):
        load_config(path, ["model.d_model"])


def test_yaml_round_trip_gives_an_equal_config(tmp_path):
    cfg = load_config(ROOT / "configs" / "multi30k.yaml", ["train.lr=0.001"])
    save_config(cfg, tmp_path / "run" / "config.yaml")
    again = load_config(tmp_path / "run" / "config.yaml")
    assert again == cfg
    assert config_from_dict(yaml.safe_load(dump_config(cfg))) == cfg


def test_defaults_and_nested_corpus_defaults():
    cfg = config_from_dict({"data": {"train": {"src": "a", "tgt": "b"}}})
    assert cfg.data.valid[0].split == "validation" and not cfg.data.corpora("valid")
    assert cfg.data.train[0].given and config_to_dict(cfg)["data"]["train"]["src"] == "a"
    assert Config() == config_from_dict({})


def test_a_split_may_list_several_corpora_with_weights(tmp_path):
    data = {
        "data": {
            "train": [{"src": "a.en", "tgt": "a.de"}, {"path": "b.tsv", "weight": 4}],
            "valid": [{"hub": "wmt14", "hub_config": "de-en"}],
        }
    }
    cfg = config_from_dict(data)
    assert [c.weight for c in cfg.data.corpora("train")] == [1, 4]
    assert cfg.data.valid[0].split == "validation"  # the split's defaults hold in a list
    assert config_to_dict(cfg)["data"]["train"][1]["path"] == "b.tsv"
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg
    again = load_config(tmp_path / "config.yaml", ["data.train.1.weight=2"])
    assert again.data.train[1].weight == 2 and again.data.train[0] == cfg.data.train[0]
    with pytest.raises(
        ConfigError,
        match=r"--set data.train.src: data.train is a list of 2; "
        r"address an item by its index, 0 to 1",
    ):
        load_config(tmp_path / "config.yaml", ["data.train.src=x"])
    with pytest.raises(
        ConfigError,
        match=r"data.train.1.weigth is not a key; did you mean "
        r"data.train.1.weight\?",
    ):
        config_from_dict({"data": {"train": [{"src": "a", "tgt": "b"}, {"weigth": 2}]}})
    with pytest.raises(ConfigError, match=r"data.train.1: no data given"):
        config_from_dict({"data": {"train": [{"src": "a", "tgt": "b"}, {"weight": 2}]}})
    with pytest.raises(
        ConfigError,
        match=r"data.valid.weight: weights apply to data.train "
        r"only",
    ):
        config_from_dict({"data": {"valid": {"src": "a", "tgt": "b", "weight": 2}}})
    with pytest.raises(ConfigError, match=r"data.train.weight must be in \[1, 1000\], got 0"):
        config_from_dict({"data": {"train": {"src": "a", "tgt": "b", "weight": 0}}})


def test_corpus_needs_both_sides_and_one_kind_of_source():
    with pytest.raises(ConfigError, match=r"data.train needs both src and tgt"):
        config_from_dict({"data": {"train": {"src": "a"}}})
    with pytest.raises(ConfigError, match=r"only one of src/tgt, path, hub"):
        config_from_dict({"data": {"train": {"src": "a", "tgt": "b", "hub": "wmt14"}}})


def test_tmx_inline_is_strip_or_keep_and_only_for_a_tmx_path():
    cfg = config_from_dict({"data": {"train": {"path": "tm.TMX.gz", "tmx_inline": "keep"}}})
    assert cfg.data.train[0].tmx and cfg.data.train[0].tmx_inline == "keep"
    assert not CorpusConfig(path="tm.tsv").tmx and CorpusConfig().tmx_inline == "strip"
    with pytest.raises(
        ConfigError, match=r"data.train.tmx_inline must be one of 'strip', 'keep', got 'tags'"
    ):
        config_from_dict({"data": {"train": {"path": "tm.tmx", "tmx_inline": "tags"}}})
    with pytest.raises(ConfigError, match=r"^data.train.tmx_inline applies to a .tmx path only$"):
        config_from_dict({"data": {"train": {"src": "a", "tgt": "b", "tmx_inline": "keep"}}})


def test_missing_and_malformed_files_give_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"no such config file"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"invalid YAML \(line \d+\)"):
        load_config(write(tmp_path, "model:\n  d_model: [1\n"))
    with pytest.raises(ConfigError, match=r"top level must be a mapping"):
        load_config(write(tmp_path, "- 1\n- 2\n"))


def test_shipped_configs_load():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        assert isinstance(load_config(path), Config), path


def test_on_and_off_unquoted_read_as_the_words_where_a_setting_takes_them(tmp_path):
    """YAML 1.1 reads `cuda_graphs: off` as false; where on and off are the values a
    setting takes, they mean the words (elsewhere a boolean stays an error)."""
    path = tmp_path / "exp.yaml"
    path.write_text("run_dir: run\ntrain:\n  cuda_graphs: off\n")
    assert load_config(path).train.cuda_graphs == "off"
    path.write_text("run_dir: run\ntrain:\n  cuda_graphs: on\n")
    assert load_config(path).train.cuda_graphs == "on"
    path.write_text("run_dir: run\ntrain:\n  precision: off\n")
    with pytest.raises(
        ConfigError, match=r"train.precision must be one of 'auto', 'fp32', 'bf16', got False"
    ):
        load_config(path)
