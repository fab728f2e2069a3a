"""Typed experiment configuration: frozen dataclasses, YAML loading, dotted overrides.

YAML is only the serialization of `Config`. Loading rejects unknown keys, wrong types
and out-of-range values with a `ConfigError` whose one-line message names the file, the
dotted key and, for a typo, the nearest valid key:

    config error: configs/multi30k.yaml: model.dmodel is not a key; did you mean model.d_model?
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from mtkit.core.atomic import write_atomic
from mtkit.core.configcheck import ConfigError, build_section, language_code_fault, value_range
from mtkit.core.search_options import OPTIONS

log = logging.getLogger(__name__)

# The config files `load_config` has read in this process, which `save_config` never
# writes over (with `run_dir: .`, RUN/config.yaml is the user's own file).
_read_configs: list[Path] = []


def _option(name: str):
    """A `decode:` field: the decoding option's default and range (`OPTIONS`)."""
    option = OPTIONS[name]
    return field(
        default=option.default, metadata=value_range(option.low, option.high, option.above)
    )


@dataclass(frozen=True)
class CorpusConfig:
    """One split of parallel data. Give exactly one of: `src`+`tgt` (two line-aligned
    text files, plain or .gz), `path` (TSV, JSONL or Parquet with columns `src_col` and
    `tgt_col`, or a `translation` dict column; or a TMX translation memory, .tmx or
    .tmx.gz, whose tuvs in `src_lang` and `tgt_lang` give the pairs), or `hub` (a
    dataset name or a local dataset folder for `datasets.load_dataset`, with
    `hub_config` and `split`).

    A split may list several corpora; `weight` k repeats a corpus's pairs k times in the
    split (upsampling a small in-domain corpus, as WMT recipes do)."""

    src: str = ""
    tgt: str = ""
    path: str = ""
    hub: str = ""
    hub_config: str = ""
    split: str = "train"
    src_col: str = "src"
    tgt_col: str = "tgt"
    weight: int = field(default=1, metadata=value_range(1, 1000))
    # Its languages ("": the data section's); several targets: multilingual (`languages`)
    src_lang: str = ""
    tgt_lang: str = ""
    # A TMX file's inline codes (bpt, ept, it, ph, ut, sub, hi): taken out of the text,
    # hi's text kept ("strip"), or kept as the file writes them, its text XML-escaped
    # ("keep": for a model trained to carry tags)
    tmx_inline: Literal["strip", "keep"] = "strip"

    @property
    def given(self) -> bool:
        return bool(self.src or self.tgt or self.path or self.hub)

    @property
    def tmx(self) -> bool:
        """Whether `path` names a TMX file (.tmx or .tmx.gz, in any case)."""
        return self.path.lower().removesuffix(".gz").endswith(".tmx")


Corpora = tuple[CorpusConfig, ...]  # in YAML: one mapping, or a list of them


@dataclass(frozen=True)
class MultiwayConfig:
    """A short way to ask for many directions of a multi-way parallel corpus (line i of
    every language's file the same sentence): the file of each language is the split's
    pattern with `{lang}` replaced. `load_config` expands it into `data.train`,
    `data.valid` and `data.test`, one corpus per direction, and that explicit list is
    what RUN/config.yaml holds:

        multiway:
          languages: [en, de, fr]
          directions: [en-de, de-en, en-fr, fr-en]   # omitted: every ordered pair
          test_directions: [en-de, de-fr]            # omitted: the directions
          train: data/multi30k/train.{lang}.gz
    """

    languages: tuple[str, ...] = ()
    directions: tuple[str, ...] = ()  # "src-tgt"; () = every ordered pair of `languages`
    test_directions: tuple[str, ...] = ()  # () = `directions`; more: zero-shot directions
    train: str = ""  # file patterns with {lang}; "" = the split is not given this way
    valid: str = ""
    test: str = ""


@dataclass(frozen=True)
class DataConfig:
    train: Corpora = (CorpusConfig(),)
    valid: Corpora = (CorpusConfig(split="validation"),)
    test: Corpora = (CorpusConfig(split="test"),)
    src_lang: str = "en"
    tgt_lang: str = "de"
    # Cleaning (train only, except that empty pairs are dropped everywhere).
    max_len: int = field(default=256, metadata=value_range(1))  # subword tokens per side
    min_len: int = field(default=1, metadata=value_range(1))
    max_len_ratio: float = field(default=3.0, metadata=value_range(1.0))  # 0 would mean no limit
    dedup: bool = False
    workers: int = field(default=2, metadata=value_range(1, 256))  # encoding processes
    loader_workers: int = field(default=1, metadata=value_range(0, 64))  # DataLoader workers
    # Sampling across the directions of a multilingual run: each epoch draws a direction's
    # pairs in proportion to (its pairs) ** (1 / temperature), on top of the corpora's
    # weights (1: as they are; 5: closer to uniform, as XLM and M2M-100 do).
    temperature: float = field(default=1.0, metadata=value_range(1.0, 100.0))
    multiway: MultiwayConfig = MultiwayConfig()  # expanded at load (`expand_multiway`)
    # Drop training pairs whose sides are not detected as their corpus's languages
    # (py3langid, among the run's languages: pip install 'mtkit[langid]').
    langid_filter: bool = False

    def corpora(self, split: str) -> Corpora:
        """The corpora given for `split` (empty when the split is not set)."""
        return tuple(c for c in getattr(self, split) if c.given)


@dataclass(frozen=True)
class TokenizerConfig:
    model_type: Literal["bpe", "unigram"] = "bpe"
    vocab_size: int = field(default=8000, metadata=value_range(8))
    joint: bool = True  # one model for both languages; False trains spm.src / spm.tgt
    character_coverage: float = field(default=1.0, metadata=value_range(0.9, 1.0))
    input_sentence_size: int = field(default=2_000_000, metadata=value_range(0))  # 0 = all
    seed: int = field(default=1, metadata=value_range(0))
    # `tokenizer.from: CKPT` (YAML key "from"): use that checkpoint's tokenizers and ids
    # instead of training new ones (fine-tuning, a distilled student); a run directory
    # names its checkpoints' one tokenizer; "" trains them.
    from_: str = ""


@dataclass(frozen=True)
class ModelConfig:
    encoder_layers: int = field(default=6, metadata=value_range(1, 64))
    decoder_layers: int = field(default=6, metadata=value_range(1, 64))
    d_model: int = field(default=512, metadata=value_range(2))
    heads: int = field(default=8, metadata=value_range(1))
    ffn_dim: int = field(default=2048, metadata=value_range(1))
    dropout: float = field(default=0.1, metadata=value_range(0.0, 0.9))
    attention_dropout: float = field(default=0.0, metadata=value_range(0.0, 0.9))
    # The paper's ReLU; GELU; or SiLU ("swish", x * sigmoid(x): Marian / OPUS-MT's).
    activation: Literal["relu", "gelu", "swish"] = "relu"
    # The paper applies LayerNorm after each residual ("post"); "pre" is the common,
    # more stable departure (norm first, one final LayerNorm per stack).
    norm: Literal["post", "pre"] = "post"
    # The paper's sines and cosines interleaved (sin at even dimensions); learned; or
    # "sinusoidal_split": sines in the first half of the dimensions, cosines in the second
    # (Marian's layout, for imported models).
    positions: Literal["sinusoidal", "learned", "sinusoidal_split"] = "sinusoidal"
    max_positions: int = field(default=1024, metadata=value_range(8))
    share_embeddings: bool = True  # one embedding for source, target and output
    # A fixed bias added to the output logits (Marian's final_logits_bias, not trained);
    # only imported models have one unless a config asks for it.
    output_bias: bool = False
    # Where a multilingual model reads its target language's <2xx> tag: at the start of
    # the source (Johnson et al.; OPUS-MT), or as the decoder's first token after bos.
    lang_tag: Literal["source", "target"] = "source"


@dataclass(frozen=True)
class TrainConfig:
    max_tokens: int = field(default=4096, metadata=value_range(16))
    update_freq: int = field(default=1, metadata=value_range(1))
    lr: float = field(default=7e-4, metadata=value_range(0.0, 10.0, lo_open=True))
    warmup_steps: int = field(default=4000, metadata=value_range(0))
    # After the warm-up: the paper's inverse square root, or a linear decay to 0 at the
    # end of the budget (max_steps, or max_time by the training clock):
    # `mtkit.training.optim`.
    lr_schedule: Literal["inverse_sqrt", "linear"] = "inverse_sqrt"
    label_smoothing: float = field(default=0.1, metadata=value_range(0.0, 0.99))
    weight_decay: float = field(default=0.0, metadata=value_range(0.0))
    clip_norm: float = field(default=1.0, metadata=value_range(0.0))  # 0 = no clipping
    max_steps: int = field(default=0, metadata=value_range(0))
    # Guided alignment (Garg et al., 2019; as Marian's and OpenNMT's): head 0 of the
    # second-to-last decoder layer's cross-attention learns the subword alignments that
    # eflomal finds in the training pairs at preprocess time (`mtkit.data.alignments`,
    # pip install 'mtkit[align]'), its cross-entropy weighted by this much beside the
    # translation loss; 0 = off. Translation then takes word alignments (and so where a
    # document's tags go) from that head.
    guided_alignment: float = field(default=0.0, metadata=value_range(0.0, 10.0))
    max_epochs: int = field(default=0, metadata=value_range(0))
    max_time: float = field(default=0, metadata=value_range(0))  # seconds
    valid_every: int = field(default=500, metadata=value_range(1))
    save_every: int = field(default=0, metadata=value_range(0))  # 0 = at each validation only
    patience: int = field(default=10, metadata=value_range(0))  # 0 = never stop early
    keep_last: int = field(default=5, metadata=value_range(0))
    average_last: int = field(default=0, metadata=value_range(0))  # `mtkit run` averages these
    seed: int = field(default=1, metadata=value_range(0))
    device: Literal["auto", "cpu", "cuda"] = "auto"
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    # The attention kernel: SDPA, or explicit matmul + softmax; auto times both at the
    # model's shapes in the run's precision, at the first start (`mtkit.tuning.attention`).
    attention: Literal["auto", "sdpa", "matmul"] = "auto"
    # Batches token-bucketed to their pairs' lengths (exact), or padded into a few shapes
    # (classes: for CPUs that compile a bf16 kernel per shape, where compiling costs far
    # more than running it); auto measures what a new shape costs, in bf16 on a CPU only,
    # at the first start (`mtkit.tuning.shapes`).
    batch_shapes: Literal["auto", "exact", "classes"] = "auto"
    # Each batch shape's update as a captured CUDA graph, replayed (on CUDA, in one
    # process, with update_freq 1; elsewhere updates run eagerly); auto times an update
    # of each kind at the first start (`mtkit.training.graphs`). Off by default until
    # `benchmarks/gpu_check.sh` has measured it on a GPU.
    cuda_graphs: Literal["auto", "on", "off"] = "off"
    log_every: int = field(default=100, metadata=value_range(1))
    # Start from a checkpoint's weights (and its model section; dropout stays this
    # config's), with a fresh optimizer and schedule: fine-tuning. A checkpoint file, or
    # a run directory (its final model: `mtkit run`'s test model). "": random weights.
    init_from: str = ""
    # Of init_from's layers, those the model starts from, by index; fewer than it has
    # make a smaller model (a student that starts from its teacher's layers, "shrink
    # and fine-tune", Shleifer & Rush 2020). Empty: all of them.
    init_encoder_layers: tuple[int, ...] = ()
    init_decoder_layers: tuple[int, ...] = ()
    # Parameters not trained: the embeddings (and so the tied output projection), the
    # encoder, or both (small data).
    freeze: Literal["none", "embeddings", "encoder", "embeddings+encoder"] = "none"
    tensorboard: bool = False  # also write RUN/tensorboard/ (pip install 'mtkit[tensorboard]')


@dataclass(frozen=True)
class DecodeConfig:
    """The decoding defaults a checkpoint carries (`decode:`): the YAML form of
    `mtkit.core.search_options.SearchOptions`' length and beam settings, plus `batch_tokens`.
    Defaults and ranges are the options' own (`mtkit.core.search_options.OPTIONS`)."""

    beam: int = _option("beam")
    lenpen: float = _option("lenpen")
    max_len_a: float = _option("max_len_a")  # capped to the positions
    max_len_b: int = _option("max_len_b")  # capped to the positions
    batch_tokens: int = _option("batch_tokens")
    lang_vocab: bool = _option("lang_vocab")  # a multilingual model's: `output_groups`
    shortlist: bool = _option("shortlist")  # a distilled student's (`mtkit.search.shortlist`)
    # What the PyTorch engine translates in: auto measures on a CPU (bf16 only where it is
    # clearly faster: `tuning.precision.inference_precision`) and takes bf16 on CUDA; int8 (a CPU's
    # dynamic int8 products, `mtkit.model.int8`) only when asked.
    precision: Literal["auto", "fp32", "bf16", "int8"] = "auto"
    # Decoder steps as CUDA graphs (`mtkit.search.captured`): on and auto take them where
    # the device can capture them (CUDA), off never. Off by default until measured on a GPU.
    cuda_graphs: Literal["auto", "on", "off"] = "off"
    # Decoder steps compiled by Inductor on a CPU (`mtkit.search.compiled`): auto times
    # eager against compiled steps once per machine (measured.json), on compiles unmeasured.
    # Off by default: compiling takes 6-100 s a process, more than a short file gains.
    compile: Literal["auto", "on", "off"] = "off"
    # Batches translated at once on a CPU, each on its share of the threads
    # (`mtkit.engines.workers`; CTranslate2's inter_threads): 1 = one batch at a time on
    # all of them; 0 = auto: one per thread, at most 8 (`search_options.cpu_workers`).
    workers: int = field(default=0, metadata=value_range(0, 256))
    # A line of several sentences is translated sentence by sentence and joined back on
    # its line (`mtkit.documents.sentences`); false for a model trained on documents
    # (lines of several sentences), which translates each line whole.
    split: bool = True


@dataclass(frozen=True)
class DistillConfig:
    """`mtkit distill`: sequence-level knowledge distillation (Kim & Rush, 2016). A teacher
    translates the source side of data.train with beam search, and this run's model (the
    student) trains on the teacher's translations instead of the references."""

    # checkpoint file(s) (several: an ensemble), a teacher's run directory (its final
    # model: the average of its `train.average_last` checkpoints, else best.pt), or a
    # teacher's config file (.yaml: `mtkit run` runs it first, skipping what is done);
    # () = no distillation
    teacher: tuple[str, ...] = ()
    beam: int = field(default=5, metadata=value_range(1, 64))
    keep_original: bool = False  # the student trains on the original pairs too
    # Filters on the teacher's translations (0 = off), their counts in the manifest:
    # the teacher's mean -log p per output token (eos included) above `max_cost` (a
    # translation it was unsure of), and output/source pieces beyond `max_len_ratio`
    # either way (a hallucination or a dropped clause)
    max_cost: float = field(default=0.0, metadata=value_range(0.0))
    max_len_ratio: float = field(default=0.0, metadata=value_range(0.0))
    # The teacher's precision (as translate's --precision; auto is measured once and
    # kept, so a resumed distillation translates as it began)
    precision: Literal["auto", "fp32", "bf16", "int8"] = "auto"
    chunk_lines: int = field(default=2000, metadata=value_range(1))  # a unit of resuming
    # The lexical shortlist built from the distilled corpus and kept in the student's
    # checkpoints (`translate --shortlist`): target pieces per source piece (0: none),
    # and the most frequent target pieces, which every batch may output
    shortlist: int = field(default=50, metadata=value_range(0))
    shortlist_frequent: int = field(default=100, metadata=value_range(0))


@dataclass(frozen=True)
class Config:
    run_dir: str = "runs/default"
    data: DataConfig = DataConfig()
    tokenizer: TokenizerConfig = TokenizerConfig()
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    decode: DecodeConfig = DecodeConfig()
    distill: DistillConfig = DistillConfig()

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir)


# --- building from plain data -------------------------------------------------------


def _check_consistency(cfg: Config, where: str) -> None:
    m = cfg.model
    if m.d_model % m.heads:
        raise ConfigError(
            f"{where}model.d_model ({m.d_model}) must be divisible by model.heads ({m.heads})"
        )
    if m.max_positions < cfg.data.max_len + 2:
        raise ConfigError(
            f"{where}model.max_positions ({m.max_positions}) must be at least "
            f"data.max_len + 2 ({cfg.data.max_len + 2}): a pair's longest side "
            f"plus bos/eos must fit the model's positions"
        )
    if m.share_embeddings and not cfg.tokenizer.joint and not cfg.tokenizer.from_:
        raise ConfigError(f"{where}model.share_embeddings needs tokenizer.joint: true")
    if cfg.train.average_last > cfg.train.keep_last:
        raise ConfigError(
            f"{where}train.average_last ({cfg.train.average_last}) must not "
            f"exceed train.keep_last ({cfg.train.keep_last})"
        )
    t = cfg.train
    if t.lr_schedule == "linear" and not (t.max_steps or t.max_time):
        raise ConfigError(
            f"{where}train.lr_schedule: linear decays over the budget, so it "
            f"needs train.max_steps or train.max_time"
        )
    _check_languages(cfg.data, where)
    _check_targets(cfg.data, where)
    for split in ("train", "valid", "test"):
        corpora = getattr(cfg.data, split)
        for i, c in enumerate(corpora):
            name = f"data.{split}" + (f".{i}" if len(corpora) > 1 else "")
            kinds = [bool(c.src or c.tgt), bool(c.path), bool(c.hub)]
            if sum(kinds) > 1:
                raise ConfigError(f"{where}{name} must give only one of src/tgt, path, hub")
            if bool(c.src) != bool(c.tgt):
                raise ConfigError(f"{where}{name} needs both src and tgt files")
            if c.tmx_inline != "strip" and not c.tmx:
                raise ConfigError(f"{where}{name}.tmx_inline applies to a .tmx path only")
            if len(corpora) > 1 and not c.given:
                raise ConfigError(f"{where}{name}: no data given (src/tgt, path or hub)")
            if c.weight != 1 and split != "train":
                raise ConfigError(
                    f"{where}{name}.weight: weights apply to data.train only "
                    f"(a {split} set is scored as it is)"
                )


def _check_languages(data: DataConfig, where: str) -> None:
    """Every language code, the data section's and each corpus's own ("": the data
    section's), can be a tag (`configcheck.language_code_fault`); the key named is the
    one `--set` takes (`data.train.tgt_lang`, `data.train.1.tgt_lang` in a list)."""
    named = [("data", data)]
    for split in ("train", "valid", "test"):
        corpora = getattr(data, split)
        named += [
            (f"data.{split}" + (f".{i}" if len(corpora) > 1 else ""), c)
            for i, c in enumerate(corpora)
        ]
    for key, section in named:
        for side in ("src_lang", "tgt_lang"):
            code = getattr(section, side)
            fault = language_code_fault(code) if code or section is data else None
            if fault:
                raise ConfigError(f"{where}{key}.{side}: {fault}")


def _check_targets(data: DataConfig, where: str) -> None:
    """In a multilingual run (training corpora into several languages, `mtkit.core.languages`)
    every valid and test corpus goes into one of them: the model has no tag for another."""
    targets = {c.tgt_lang or data.tgt_lang for c in data.corpora("train")}
    if len(targets) < 2:
        return
    for split in ("valid", "test"):
        for i, c in enumerate(data.corpora(split)):
            if (c.tgt_lang or data.tgt_lang) not in targets:
                raise ConfigError(
                    f"{where}data.{split}.{i}.tgt_lang {c.tgt_lang or data.tgt_lang}: the "
                    f"training data goes into {', '.join(sorted(targets))} only, so the "
                    f"model has no tag for it"
                )


def config_from_dict(data: dict, where: str = "") -> Config:
    """Build and validate a `Config`; `where` prefixes every error (e.g. the file name)."""
    prefix = f"{where}: " if where else ""
    cfg = build_section(Config, data, "", prefix)
    cfg = dataclasses.replace(cfg, data=expand_multiway(cfg.data, prefix))
    _check_consistency(cfg, prefix)
    return cfg


def _pair(text: str, languages: tuple[str, ...], key: str, where: str) -> tuple[str, str]:
    """ "en-de" -> ("en", "de"), both among `languages`."""
    parts = text.split("-")
    if len(parts) != 2 or parts[0] == parts[1] or not all(p in languages for p in parts):
        raise ConfigError(
            f"{where}{key}: {text!r} is not a direction of data.multiway."
            f"languages ({', '.join(languages)}); write it src-tgt, e.g. "
            f"{languages[0]}-{languages[-1]}"
        )
    return parts[0], parts[1]


def expand_multiway(data: DataConfig, where: str = "") -> DataConfig:
    """`data.multiway` written out: for each split with a pattern, one corpus per
    direction (test: per `test_directions`), in the order given; multiway itself reset."""
    mw = data.multiway
    if mw == MultiwayConfig():
        return data
    key = "data.multiway"
    if len(mw.languages) < 2 or len(set(mw.languages)) != len(mw.languages):
        raise ConfigError(
            f"{where}{key}.languages must list two or more languages, each "
            f"once, got {list(mw.languages)}"
        )
    for lang in mw.languages:
        fault = language_code_fault(lang)
        if fault:
            raise ConfigError(f"{where}{key}.languages: {fault}")
        if "-" in lang:  # a direction is written src-tgt
            raise ConfigError(
                f"{where}{key}.languages: {lang!r} has a -, which separates "
                f"the languages of a direction here; write it with _ (pt_BR)"
            )
    every = [f"{a}-{b}" for a in mw.languages for b in mw.languages if a != b]
    pairs = [_pair(d, mw.languages, f"{key}.directions", where) for d in mw.directions or every]
    tests = [
        _pair(d, mw.languages, f"{key}.test_directions", where) for d in mw.test_directions
    ] or pairs
    if not (mw.train or mw.valid or mw.test):
        raise ConfigError(
            f"{where}{key} gives no file pattern: set {key}.train (and valid, "
            f"test) to a path with {{lang}}"
        )
    if mw.test_directions and not mw.test:
        raise ConfigError(f"{where}{key}.test_directions needs {key}.test, the test files' pattern")
    out = {}
    for split, directions in (("train", pairs), ("valid", pairs), ("test", tests)):
        pattern = getattr(mw, split)
        if not pattern:
            continue
        if "{lang}" not in pattern:
            raise ConfigError(f"{where}{key}.{split} must contain {{lang}}, got {pattern!r}")
        if any(c.given for c in getattr(data, split)):
            raise ConfigError(f"{where}data.{split} and {key}.{split}: give one of them")
        out[split] = tuple(
            CorpusConfig(
                src=pattern.replace("{lang}", a),
                tgt=pattern.replace("{lang}", b),
                src_lang=a,
                tgt_lang=b,
            )
            for a, b in directions
        )
    return dataclasses.replace(data, **out, multiway=MultiwayConfig())


def config_to_dict(cfg: Config) -> dict:
    """Plain data for YAML: a split of one corpus is a mapping, of several a list."""
    out = dataclasses.asdict(cfg)
    out["tokenizer"]["from"] = out["tokenizer"].pop("from_")
    del out["data"]["multiway"]  # expanded at load: the corpora it gave are listed
    for split in ("train", "valid", "test"):
        corpora = out["data"][split]
        out["data"][split] = corpora[0] if len(corpora) == 1 else list(corpora)
    return out


def parse_override(text: str, option: str = "--set") -> tuple[list[str], Any]:
    """`model.d_model=512` -> (["model", "d_model"], 512). Values are read as YAML.
    `option`: what an error names as the override's source (the API's `overrides`)."""
    if "=" not in text:
        raise ConfigError(f"{option} {text!r}: expected section.key=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"{option} {text!r}: expected section.key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return parts, value


def apply_overrides(data: dict, overrides: typing.Iterable[str], option: str = "--set") -> dict:
    """Return a copy of the plain config dict with dotted overrides applied (`option`:
    what an error names as their source)."""
    out = copy.deepcopy(data)
    for text in overrides:
        parts, value = parse_override(text, option)
        node = out
        for depth, part in enumerate(parts[:-1]):
            node = _child(node, part, ".".join(parts[: depth + 1]), option)
        if isinstance(node, list):
            _child(node, parts[-1], ".".join(parts), option)  # checks the index
            node[int(parts[-1])] = value
        else:
            node[parts[-1]] = value
    return out


def _child(node: dict | list, part: str, key: str, option: str) -> dict | list:
    """The mapping (made when missing) or list under `part`; a list is indexed by number
    (`data.train.1.weight=3`)."""
    if isinstance(node, list):
        if not part.isdigit() or int(part) >= len(node):
            raise ConfigError(
                f"{option} {key}: {key.rsplit('.', 1)[0]} is a list of "
                f"{len(node)}; address an item by its index, 0 to {len(node) - 1}"
            )
        return node[int(part)]
    child = node.get(part)
    if not isinstance(child, (dict, list)):
        child = {}
        node[part] = child
    return child


def load_config(
    path: str | os.PathLike | None, overrides: typing.Iterable[str] = (), option: str = "--set"
) -> Config:
    """Read a YAML config (or start from defaults when `path` is None) and apply `--set`s
    (`option`: what an error names as their source)."""
    data: dict = {}
    where = str(path) if path is not None else option
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{path}: no such config file") from None
        except IsADirectoryError:
            raise ConfigError(f"{path} is a folder, not a config file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{path}: cannot read config: {e}") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            line = f" (line {mark.line + 1})" if mark else ""
            raise ConfigError(f"{path}: invalid YAML{line}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections")
        _read_configs.append(Path(path))
    return config_from_dict(apply_overrides(data, overrides, option), where)


def dump_config(cfg: Config) -> str:
    return yaml.safe_dump(config_to_dict(cfg), sort_keys=False)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write the resolved config atomically (RUN/config.yaml), unless `path` is a config
    file this process read (`load_config`; the same file by any name): that file is the
    user's, with their comments, and is left alone with a warning. Nothing is lost by
    not writing it: every checkpoint (and export) holds the resolved config. Refusing
    instead would forbid a config kept in its own run directory (`run_dir: .`)."""
    path = Path(path)
    payload = dump_config(cfg).encode("utf-8")
    mine = next((src for src in _read_configs if _same_file(src, path)), None)
    if mine is not None:
        if path.read_bytes() != payload:
            log.warning(
                "the resolved config is not written to %s: it is the config file "
                "given with -c (%s), which it would overwrite",
                path,
                mine,
            )
        return
    write_atomic(path, payload)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # either one is not there (any more)
        return False
