"""Datagen, vocabulary and the token-bucketed input pipeline."""

import gzip
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from conftest import BIN, REPO, cli, multi30k_dir, tiny_hparams
from t2t_lite.data import eval_input
from t2t_lite.core import registry
from t2t_lite.core.errors import UsageError
from t2t_lite.data.text import read_lines, read_parallel


def test_multi30k_manifest(multi30k_data):
  problem = registry.problem("translate_ende_multi30k")
  manifest = problem.manifest(multi30k_data)
  counts = {split: (info["read"], info["kept"]) for split, info in manifest["splits"].items()}
  assert counts == {"train": (29000, 29000), "dev": (1014, 1014), "test": (1000, 1000)}
  assert manifest["vocab"]["size"] == 8000
  assert len(problem.data_files(multi30k_data, "train")) == 4
  from t2t_lite.data.text import file_sha256
  assert manifest["vocab"]["sha256"] == file_sha256(problem.vocab_file(multi30k_data))
  assert not [f for f in os.listdir(multi30k_data) if ".tmp" in f]


def test_second_datagen_run_does_nothing(multi30k_data):
  before = {f: os.path.getmtime(os.path.join(multi30k_data, f)) for f in os.listdir(multi30k_data)}
  result = cli("t2t-lite-datagen", "--problem=translate_ende_multi30k",
               f"--data_dir={multi30k_data}", f"--tmp_dir={multi30k_dir()}", check=True)
  assert "up to date with its inputs; nothing to do" in result.stdout
  after = {f: os.path.getmtime(os.path.join(multi30k_data, f)) for f in os.listdir(multi30k_data)}
  assert before == after


def test_sentencepiece_round_trip(multi30k_data):
  vocab = registry.problem("translate_ende_multi30k").get_vocab(multi30k_data)
  lines = [line.strip() for lang in ("en", "de")
           for line in read_lines(os.path.join(multi30k_dir(), f"test_2016_flickr.{lang}.gz"))]
  same = sum(vocab.decode(vocab.encode(line)) == line for line in lines)
  assert same / len(lines) >= 0.999, f"{len(lines) - same} of {len(lines)} lines changed"
  assert vocab.encode("A dog.")[-1] == 1  # ends with EOS


def _sequences(batch):
  out = []
  for src, tgt in zip(batch["inputs"].numpy(), batch["targets"].numpy()):
    out.append((tuple(src[src != 0]), tuple(tgt[tgt != 0])))
  return out


def test_batches_fit_batch_size_and_one_epoch_has_every_example_once(multi30k_data):
  problem = registry.problem("translate_ende_multi30k")
  files = problem.data_files(multi30k_data, "dev")
  hparams = tiny_hparams(batch_size=300, max_length=40)
  expected = sorted(_sequences({k: v[None] for k, v in ex.items()})[0]
                    for ex in eval_input.examples(files, 40))
  seen = []
  for batch in eval_input.eval_dataset(files, hparams):
    rows, longest = batch["inputs"].shape[0], max(batch["inputs"].shape[1],
                                                    batch["targets"].shape[1])
    assert rows * longest <= 300
    seen.extend(_sequences(batch))
  assert sorted(seen) == expected
  all_examples = sum(1 for _ in eval_input.examples(files, 1000))
  assert 900 < len(expected) < all_examples, "max_length=40 should drop a few dev pairs"


# --- bad input, through translate_folder and the real CLI ---------------------------------

def _corpus(folder, lines=300, **edits):
  os.makedirs(folder, exist_ok=True)
  src = read_lines(os.path.join(multi30k_dir(), "train.en.gz"))[:lines]
  tgt = read_lines(os.path.join(multi30k_dir(), "train.de.gz"))[:lines]
  for split in ("train", "dev", "test"):
    for lang, text in (("en", src), ("de", tgt)):
      path = os.path.join(folder, f"{split}.{lang}")
      with open(path, "wb") as f:
        f.write(("\n".join(text) + "\n").encode())
  for name, content in edits.items():
    with open(os.path.join(folder, name.replace("_", ".")), "wb") as f:
      f.write(content)


def _datagen(tmp_path, raw):
  return cli("t2t-lite-datagen", "--problem=translate_folder", f"--data_dir={tmp_path / 'out'}",
             f"--tmp_dir={raw}", "--source_lang=en", "--target_lang=de", "--vocab_size=300")


def test_folder_corpus_drops_and_counts_empty_pairs(tmp_path):
  raw = tmp_path / "raw"
  _corpus(raw)
  lines = (raw / "train.de").read_text().splitlines()
  lines[3], lines[10] = "", "   "
  (raw / "train.de").write_text("\n".join(lines) + "\n")
  with gzip.open(raw / "dev.en.gz", "wt") as f:  # .gz files are read too
    f.write((raw / "dev.en").read_text())
  os.remove(raw / "dev.en")
  result = _datagen(tmp_path, raw)
  assert result.returncode == 0, result.stderr
  assert "translate_folder train: 300 pairs read, 298 kept (dropped: 2 empty_or_whitespace)" \
      in result.stdout
  manifest = json.loads((tmp_path / "out" / "translate_folder.manifest.json").read_text())
  assert manifest["splits"]["train"]["dropped"] == {"empty_or_whitespace": 2}
  assert manifest["settings"]["source_lang"] == "en"


def _assert_usage_error(result, *fragments, out_dir=None):
  assert result.returncode == 2, result.stderr
  for fragment in fragments:
    assert fragment in result.stderr
  assert "Traceback" not in result.stderr
  if out_dir is not None and out_dir.exists():
    assert not [f for f in os.listdir(out_dir)
                if "manifest" in f or ".tmp" in f or ".data-" in f]


def test_line_count_mismatch_names_both_files(tmp_path):
  raw = tmp_path / "raw"
  _corpus(raw)
  (raw / "dev.de").write_text("ein Satz\n" * 5)
  result = _datagen(tmp_path, raw)
  _assert_usage_error(result, f"line counts differ: {raw}/dev.en has 300 lines, "
                      f"{raw}/dev.de has 5", out_dir=tmp_path / "out")


def test_invalid_utf8_names_file_and_line(tmp_path):
  raw = tmp_path / "raw"
  _corpus(raw)
  lines = (raw / "test.en").read_bytes().split(b"\n")
  lines[41] = b"caf\xe9 au lait"
  (raw / "test.en").write_bytes(b"\n".join(lines))
  result = _datagen(tmp_path, raw)
  _assert_usage_error(result, f"{raw}/test.en: line 42 is not valid UTF-8",
                      out_dir=tmp_path / "out")


def test_vocabulary_too_big_for_the_corpus(tmp_path):
  raw = tmp_path / "raw"
  _corpus(raw)
  result = cli("t2t-lite-datagen", "--problem=translate_folder", f"--data_dir={tmp_path / 'out'}",
               f"--tmp_dir={raw}", "--source_lang=en", "--target_lang=de", "--vocab_size=32000")
  _assert_usage_error(result, "the translate_folder training text is too small for a "
                      "32000-piece vocabulary (at most ", "); pass a smaller --vocab_size",
                      out_dir=tmp_path / "out")
  assert result.stderr.strip().splitlines()[-1].startswith(
      "t2t-lite-datagen: error: the translate_folder training text is too small")


def test_vocab_size_applies_to_every_problem_and_languages_only_to_folders(tmp_path):
  from t2t_lite.core import registry
  problem = registry.problem("translate_ende_wmt14")
  problem.configure(vocab_size=8000, source_lang="", target_lang="")
  assert problem.vocab_size == 8000 and problem._settings()["vocab_size"] == 8000
  result = cli("t2t-lite-datagen", "--problem=translate_ende_multi30k", "--source_lang=fr",
               f"--data_dir={tmp_path / 'out'}", f"--tmp_dir={multi30k_dir()}")
  _assert_usage_error(result, "problem translate_ende_multi30k takes no --source_lang")


def test_missing_file_says_where_it_looked(tmp_path):
  raw = tmp_path / "raw"
  _corpus(raw)
  os.remove(raw / "test.de")
  result = _datagen(tmp_path, raw)
  _assert_usage_error(result, f"missing data file test.de: looked for {raw}/test.de and "
                      f"{raw}/test.de.gz", out_dir=tmp_path / "out")


def test_missing_multi30k_file_offline(tmp_path):
  result = cli("t2t-lite-datagen", "--problem=translate_ende_multi30k",
               f"--data_dir={tmp_path / 'out'}", f"--tmp_dir={tmp_path / 'raw'}",
               env={"https_proxy": "http://127.0.0.1:9", "HTTPS_PROXY": "http://127.0.0.1:9"})
  _assert_usage_error(result, "missing Multi30k file train.en.gz: looked for "
                      f"{tmp_path / 'raw'}/train.en.gz", "get_multi30k.sh")


def test_unknown_problem_suggests(tmp_path):
  result = cli("t2t-lite-datagen", "--problem=translate_ende_multi30", "--data_dir=x",
               "--tmp_dir=y")
  _assert_usage_error(result, "did you mean translate_ende_multi30k")


def test_wmt14_unprepared_fails_fast(tmp_path):
  """Offline, tensorflow-datasets would retry the download for minutes: a hang past the
  timeout fails this test (subprocess.TimeoutExpired)."""
  result = cli("t2t-lite-datagen", "--problem=translate_ende_wmt14",
               f"--data_dir={tmp_path / 'out'}", f"--tmp_dir={tmp_path / 'tfds'}", timeout=60)
  _assert_usage_error(result, "wmt14_translate/de-en is not prepared", "prepare_wmt14_ende.sh")


def _prepared_wmt14_stand_in(tfds_dir, monkeypatch, pairs=300):
  """A prepared wmt14_translate/de-en holding Multi30k sentences: tensorflow-datasets' own
  builder writes it, with its download step replaced by reading the local files."""
  import tensorflow_datasets as tfds
  names = {"train": "train", "validation": "val", "test": "test_2016_flickr"}
  builder = tfds.builder("wmt14_translate/de-en", data_dir=str(tfds_dir))

  def split_generators(self, dl_manager):
    return [tfds.core.SplitGenerator(name=split, gen_kwargs={"split": split}) for split in names]

  def generate_examples(self, split):
    text = {lang: read_lines(os.path.join(multi30k_dir(), f"{names[split]}.{lang}.gz"))[:pairs]
            for lang in ("en", "de")}
    for i, (en, de) in enumerate(zip(text["en"], text["de"])):
      yield i, {"en": en, "de": de}

  monkeypatch.setattr(type(builder), "_split_generators", split_generators)
  monkeypatch.setattr(type(builder), "_generate_examples", generate_examples)
  builder.download_and_prepare()


def test_wmt14_datagen_reads_a_prepared_tfds_dataset(tmp_path, monkeypatch):
  _prepared_wmt14_stand_in(tmp_path / "tfds", monkeypatch)
  result = cli("t2t-lite-datagen", "--problem=translate_ende_wmt14", "--vocab_size=500",
               f"--data_dir={tmp_path / 'out'}", f"--tmp_dir={tmp_path / 'tfds'}", check=True)
  for split in ("train", "dev", "test"):
    assert f"translate_ende_wmt14 {split}: 300 pairs read, 300 kept" in result.stdout
  manifest = json.loads((tmp_path / "out" / "translate_ende_wmt14.manifest.json").read_text())
  assert manifest["splits"]["train"]["source"] == "tfds wmt14_translate/de-en:train"
  assert manifest["settings"]["vocab_size"] == 500 and manifest["vocab"]["size"] == 500
  assert len(manifest["splits"]["train"]["files"]) == 100
  assert manifest["inputs"]["examples"] == {"train": 300, "validation": 300, "test": 300}


def test_interrupted_datagen_is_redone(tmp_path):
  raw = tmp_path / "raw"
  _corpus(raw)
  assert _datagen(tmp_path, raw).returncode == 0
  out = tmp_path / "out"
  problem = registry.problem("translate_folder")
  shard = problem.data_files(str(out), "train")[0]
  with open(shard, "r+b") as f:
    f.truncate(100)  # a half-written file
  result = _datagen(tmp_path, raw)
  assert result.returncode == 0 and "nothing to do" not in result.stdout
  manifest = problem.manifest(str(out))
  shard = problem.data_files(str(out), "train")[0]
  assert os.path.getsize(shard) == manifest["splits"]["train"]["bytes"][0] > 100
  os.remove(out / "translate_folder.manifest.json")  # died before the manifest
  assert "nothing to do" not in _datagen(tmp_path, raw).stdout


def _digests(folder):
  """sha256 of every file under `folder`, by path relative to it."""
  import hashlib
  return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(folder.rglob("*")) if p.is_file()}


def test_datagen_never_replaces_other_data_unasked_nor_in_place(tmp_path):
  """Data of other inputs or settings in --data_dir is refused (exit 2, saying what differs)
  and left whole; --overwrite replaces it in one rename: the new files are written to a
  folder of their own, and a datagen killed just before the manifest's rename leaves the old
  data whole and readable; the next datagen removes what the killed one left, replaces the
  data and then removes the old files. A shard changed afterwards is refused."""
  raw, out = tmp_path / "raw", tmp_path / "out"
  _corpus(raw)
  problem = registry.problem("translate_folder")
  assert _datagen(tmp_path, raw).returncode == 0
  before = _digests(out)
  old_folder = problem.manifest(str(out))["dir"]
  assert old_folder.startswith("translate_folder.data-") and (out / old_folder).is_dir()
  asked = ["t2t-lite-datagen", "--problem=translate_folder", f"--data_dir={out}",
           f"--tmp_dir={raw}", "--source_lang=en", "--target_lang=de", "--vocab_size=280"]
  other = cli(*asked)
  _assert_usage_error(other, "holds translate_folder data made from other inputs or settings",
                      "vocab_size 300 -> 280", "write the new data to another --data_dir",
                      "--overwrite")
  assert _digests(out) == before
  killed = cli(*asked, "--overwrite", env=dict(os.environ, T2T_LITE_FAULT="datagen:written"))
  assert killed.returncode == -9, killed.stderr[-2000:]
  assert {k: v for k, v in _digests(out).items() if k in before} == before
  assert problem.manifest(str(out))["settings"]["vocab_size"] == 300  # the old data, whole
  problem.data_files(str(out), "train")
  orphans = [p.name for p in out.iterdir() if p.is_dir() and p.name != old_folder]
  assert len(orphans) == 1 and orphans[0].startswith("translate_folder.data-")
  stale = out / "translate_folder.manifest.json.tmp-999999999"  # a temporary of a killed run
  stale.write_bytes(b"partial")
  replaced = cli(*asked, "--overwrite")
  assert replaced.returncode == 0, replaced.stderr
  manifest = problem.manifest(str(out))
  assert manifest["settings"]["vocab_size"] == 280
  assert sorted(p.name for p in out.iterdir()) == sorted([manifest["dir"],
                                                          "translate_folder.manifest.json"])
  assert manifest["dir"] not in (old_folder, orphans[0])
  vocab = f"{manifest['dir']}/translate_folder.vocab.model"
  assert _digests(out)[vocab] != before[f"{old_folder}/translate_folder.vocab.model"]
  shard = problem.data_files(str(out), "train")[0]
  with open(shard, "ab") as f:
    f.write(b"x")
  with pytest.raises(UsageError, match="bytes, the manifest says .* changed after datagen"):
    problem.data_files(str(out), "train")


def test_data_made_before_datagen_folders_is_read_and_replaced_whole(tmp_path):
  """A data directory whose files sit in it directly (no folder in the manifest) is read as
  before; a datagen that replaces it removes those files after the new manifest is in."""
  raw, out = tmp_path / "raw", tmp_path / "out"
  _corpus(raw)
  problem = registry.problem("translate_folder")
  assert _datagen(tmp_path, raw).returncode == 0
  manifest = problem.manifest(str(out))
  for path in (out / manifest["dir"]).iterdir():  # the layout of earlier versions
    path.rename(out / path.name)
  (out / manifest["dir"]).rmdir()
  path = out / "translate_folder.manifest.json"
  older = json.loads(path.read_text())
  del older["dir"]
  path.write_text(json.dumps(older))
  assert problem.data_files(str(out), "train")[0].startswith(str(out / "translate_folder-train"))
  assert problem.vocab_file(str(out)) == str(out / "translate_folder.vocab.model")
  assert "nothing to do" in _datagen(tmp_path, raw).stdout  # up to date, left as it is
  replaced = cli("t2t-lite-datagen", "--problem=translate_folder", f"--data_dir={out}",
                 f"--tmp_dir={raw}", "--source_lang=en", "--target_lang=de",
                 "--vocab_size=280", "--overwrite")
  assert replaced.returncode == 0, replaced.stderr
  new = problem.manifest(str(out))
  assert sorted(p.name for p in out.iterdir()) == sorted([new["dir"],
                                                          "translate_folder.manifest.json"])


def test_batch_size_smaller_than_max_length_is_refused():
  with pytest.raises(UsageError, match="batch_size=100 tokens cannot hold one sequence"):
    eval_input.check_batch_size(100, 256)


def test_bucket_boundaries_are_geometric():
  boundaries = eval_input.bucket_boundaries(64)
  assert boundaries[:4] == [8, 9, 10, 11] and boundaries[-1] == 65
  steps = np.diff(boundaries[:-1]) / np.array(boundaries[:-2])
  assert (steps <= 0.125 + 1e-9).all()


def test_manifest_of_an_older_version_means_redo(tmp_path):
  raw = tmp_path / "raw"
  _corpus(raw)
  assert _datagen(tmp_path, raw).returncode == 0
  path = tmp_path / "out" / "translate_folder.manifest.json"
  manifest = json.loads(path.read_text())
  for split in manifest["splits"].values():
    del split["bytes"]
  path.write_text(json.dumps(manifest))
  result = _datagen(tmp_path, raw)
  assert result.returncode == 0, result.stderr
  assert "nothing to do" not in result.stdout
  assert "bytes" in json.loads(path.read_text())["splits"]["train"]


# --- datagen at scale: streamed, shuffled, bounded memory ---------------------------------

def _write_folder_corpus(folder, train, dev_test):
  os.makedirs(folder, exist_ok=True)
  for split, pairs in (("train", train), ("dev", dev_test), ("test", dev_test)):
    for side, lang in enumerate(("en", "de")):
      with open(os.path.join(folder, f"{split}.{lang}"), "w", encoding="utf-8") as f:
        f.writelines(pair[side] + "\n" for pair in pairs)


def _multi30k_pairs(count, start=0):
  en = read_lines(os.path.join(multi30k_dir(), "train.en.gz"))
  de = read_lines(os.path.join(multi30k_dir(), "train.de.gz"))
  return [(en[i % len(en)], de[i % len(de)]) for i in range(start, start + count)]


@pytest.fixture(scope="module")
def two_part_data(tmp_path_factory):
  """A folder corpus whose train split is two sub-corpora one after the other (2,000 pairs
  marked "A<i>", then 2,000 marked "B<i>"), through the real datagen CLI."""
  root = tmp_path_factory.mktemp("two_part")
  train = [(f"{kind}{i} {en}", f"{kind}{i} {de}") for kind, start in (("A", 0), ("B", 2000))
           for i, (en, de) in enumerate(_multi30k_pairs(2000, start))]
  _write_folder_corpus(root / "raw", train, _multi30k_pairs(100, 5000))
  cli("t2t-lite-datagen", "--problem=translate_folder", f"--data_dir={root / 'out'}",
      f"--tmp_dir={root / 'raw'}", "--source_lang=en", "--target_lang=de", "--vocab_size=500",
      check=True)
  return {"raw": str(root / "raw"), "out": str(root / "out"), "train": train}


def _shard_records(path):
  """(inputs, targets) ids of one TFRecord file, in file order (faster than eval_input.examples)."""
  import tensorflow as tf
  records = []
  for batch in tf.data.TFRecordDataset(path).batch(1000).as_numpy_iterator():
    for serialized in batch:
      feature = tf.train.Example.FromString(serialized).features.feature
      records.append((tuple(feature["inputs"].int64_list.value),
                      tuple(feature["targets"].int64_list.value)))
  return records


def test_concatenated_sub_corpora_reach_training_mixed_and_whole(two_part_data):
  problem = registry.problem("translate_folder")
  files = problem.data_files(two_part_data["out"], "train")
  vocab = problem.get_vocab(two_part_data["out"])
  kind = {(tuple(vocab.encode(source)), tuple(vocab.encode(target))): source[0]
          for source, target in two_part_data["train"]}
  assert len(kind) == 4000
  read = [pair for path in files for pair in _shard_records(path)]
  assert sorted(read) == sorted(kind)  # nothing lost, nothing duplicated
  for path in files:  # every shard is mixed from its start
    records = _shard_records(path)
    head = [kind[pair] for pair in records[:100]]
    assert 25 <= head.count("A") <= 75, f"{path}: {head.count('A')} of the first 100 from A"
  # the store holds the shards' pairs, and training's first batches mix both parts
  from t2t_lite.data.stream import Batching, SplitPlan
  store = problem.training_store(two_part_data["out"], "train")
  stored = store.batch(np.arange(len(store)))
  pairs = [(tuple(int(i) for i in source if i), tuple(int(i) for i in target if i))
           for source, target in zip(stored["inputs"], stored["targets"])]
  assert pairs == read
  plan = SplitPlan(store.lengths, Batching(400, 100), seed=1, split_number=0)
  first = [kind[pairs[i]] for b in range(20) for i in plan.batch(b)[0]][:200]
  assert 70 <= first.count("A") <= 130, f"{first.count('A')} of the first 200 are from A"



def test_shuffle_follows_the_seed(two_part_data, tmp_path):
  from t2t_lite.data import shards
  from t2t_lite.data.text import read_parallel
  problem = registry.problem("translate_folder")
  vocab = problem.get_vocab(two_part_data["out"])
  train = read_parallel(os.path.join(two_part_data["raw"], "train.en"),
                        os.path.join(two_part_data["raw"], "train.de"))
  written = {}
  for name, seed in (("again", 1), ("seed2", 2)):
    files = [str(tmp_path / f"{name}-{i}.tfrecord") for i in range(4)]
    assert shards.write_shuffled(vocab, train, files, 4000, seed) == 4000
    written[name] = files
  written["cli"] = problem.data_files(two_part_data["out"], "train")  # seed 1
  content = {name: [open(path, "rb").read() for path in files] for name, files in written.items()}
  assert content["again"] == content["cli"]  # the same seed in another process: same bytes
  assert content["seed2"] != content["cli"]
  assert (sorted(r for path in written["seed2"] for r in _shard_records(path))
          == sorted(r for path in written["cli"] for r in _shard_records(path)))
  assert not [f for f in os.listdir(tmp_path) if ".tmp" in f]  # buckets removed


def test_datagen_memory_does_not_grow_with_the_corpus(tmp_path, monkeypatch):
  import tracemalloc
  from t2t_lite.data import shards, store, vocab
  # Bounds small enough that 3,000 pairs already fill them: the sample, a chunk, a bucket,
  # the records the store parses at a time and the lengths it copies at a time.
  monkeypatch.setattr(vocab, "SAMPLE_SENTENCES", 2000)
  monkeypatch.setattr(shards, "CHUNK_PAIRS", 500)
  monkeypatch.setattr(shards, "BUCKET_PAIRS", 750)
  monkeypatch.setattr(store, "READ_BATCH", 500)
  monkeypatch.setattr(store, "CHUNK", 500)
  peaks, text_bytes = {}, {}
  for pairs in (300, 3000, 12000):  # the first run also allocates what stays (modules, caches)
    raw = tmp_path / f"raw{pairs}"
    _write_folder_corpus(raw, _multi30k_pairs(pairs), _multi30k_pairs(50))
    text_bytes[pairs] = os.path.getsize(raw / "train.en") + os.path.getsize(raw / "train.de")
    problem = registry.problem("translate_folder")
    problem.configure(source_lang="en", target_lang="de", vocab_size=300)
    tracemalloc.start()
    try:
      manifest = problem.generate_data(str(tmp_path / f"out{pairs}"), str(raw))
      peaks[pairs] = tracemalloc.get_traced_memory()[1]
    finally:
      tracemalloc.stop()
    assert manifest["splits"]["train"]["kept"] == pairs
  growth, more_text = peaks[12000] - peaks[3000], text_bytes[12000] - text_bytes[3000]
  # Holding the split in Python would grow by more than its text (str + id lists).
  assert growth < more_text / 4, (f"peak grew {growth} bytes for {more_text} more bytes of "
                                  f"text; {peaks}")


def test_reservoir_sample_is_seeded_uniform_and_whole_when_small():
  from t2t_lite.data.vocab import reservoir_sample
  assert reservoir_sample(iter(range(50)), 100, seed=1) == list(range(50))
  sample = reservoir_sample(iter(range(100_000)), 1000, seed=1)
  assert sample == reservoir_sample(iter(range(100_000)), 1000, seed=1)
  assert sample != reservoir_sample(iter(range(100_000)), 1000, seed=2)
  assert len(set(sample)) == 1000 and 45_000 < np.mean(sample) < 55_000
  assert sum(item >= 50_000 for item in sample) > 400  # the end of the stream is not ignored


def test_vocabulary_sample_keeps_within_its_character_budget():
  from t2t_lite.data.vocab import within_characters
  sentences = [f"sentence {i:06d}" for i in range(1000)]  # 15 characters each
  assert within_characters(sentences, 15_000, seed=1) is sentences  # fits: whole, in order
  subset = within_characters(sentences, 1500, seed=1)
  assert len(subset) == 100 and len(set(subset)) == 100 and set(subset) <= set(sentences)
  assert subset == within_characters(sentences, 1500, seed=1)
  assert subset != within_characters(sentences, 1500, seed=2)
  assert max(subset) > "sentence 000500"  # drawn from everywhere, not the first 100


def test_a_longer_target_file_is_found_at_the_end_of_the_stream(tmp_path):
  raw = tmp_path / "raw"
  _corpus(raw)
  with open(raw / "train.de", "a") as f:
    f.write("ein Satz zu viel\n")
  result = _datagen(tmp_path, raw)
  _assert_usage_error(result, f"line counts differ: {raw}/train.en has 300 lines, "
                      f"{raw}/train.de has 301", out_dir=tmp_path / "out")


def test_make_train_data_step_makes_12000_pieces_and_refuses_older_data(multi30k_data, tmp_path):
  """`make train`'s data step (data_scripts/multi30k_data.sh) asks for a 12000-piece
  vocabulary and 16 sampled segmentations at alpha 0.3 unless VOCAB_SIZE,
  SUBWORD_SAMPLING_COPIES (0: none) and SUBWORD_SAMPLING_ALPHA say otherwise. Data made with
  the problem's own 8000 pieces and no sampling (what `make train` made before) is refused
  (exit 2, saying what differs) and left whole, as is the same data asked for with sampling,
  or an alpha without copies; with VOCAB_SIZE=8000 and SUBWORD_SAMPLING_COPIES=0 the same
  data is up to date and kept as it is."""
  data_dir = tmp_path / "data"
  shutil.copytree(multi30k_data, data_dir)
  before = _digests(data_dir)
  script = os.path.join(REPO, "data_scripts", "multi30k_data.sh")
  env = dict(os.environ, MULTI30K_DIR=multi30k_dir(), PATH=BIN + os.pathsep + os.environ["PATH"])
  for name in ("VOCAB_SIZE", "SUBWORD_SAMPLING_COPIES", "SUBWORD_SAMPLING_ALPHA"):
    env.pop(name, None)

  def data_step(**variables):
    return subprocess.run(["bash", script, str(data_dir)], capture_output=True, text=True,
                          env=dict(env, **variables), timeout=300)

  _assert_usage_error(data_step(), "holds translate_ende_multi30k data made from other inputs "
                      "or settings (subword_sampling None -> {'copies': 16, 'alpha': 0.3}; "
                      "vocab_size 8000 -> 12000)", "another --data_dir")
  _assert_usage_error(data_step(VOCAB_SIZE="8000"),
                      "settings (subword_sampling None -> {'copies': 16, 'alpha': 0.3})")
  _assert_usage_error(data_step(VOCAB_SIZE="8000", SUBWORD_SAMPLING_COPIES="0",
                                SUBWORD_SAMPLING_ALPHA="0.5"),
                      "--subword_sampling_alpha needs --subword_sampling_copies")
  kept = data_step(VOCAB_SIZE="8000", SUBWORD_SAMPLING_COPIES="0")
  assert kept.returncode == 0, kept.stderr[-2000:]
  after = _digests(data_dir)
  assert {path: digest for path, digest in after.items() if not path.startswith("raw/")} == before
  assert sorted(path for path in after if path.startswith("raw/")) == sorted(
      f"raw/{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr")
      for lang in ("en", "de", "fr"))


# --- subword sampling ---------------------------------------------------------------------

def _sampling_datagen(raw, out, *flags):
  return cli("t2t-lite-datagen", "--problem=translate_folder", f"--data_dir={out}",
             f"--tmp_dir={raw}", "--source_lang=en", "--target_lang=de", "--vocab_size=300",
             *flags)


def test_subword_sampling_writes_seeded_sampled_copies_of_every_training_pair(tmp_path):
  """--subword_sampling_copies=3: the "train_sampled" shards hold 3 records of every pair,
  each decoding to the pair's text, most pairs with more than one segmentation among them;
  "train" holds the one best, the bytes datagen writes without sampling, and dev and test
  keep the one best. The same inputs and settings give the same bytes, and the manifest and
  the summary say what was done."""
  raw = tmp_path / "raw"
  _corpus(raw)
  flags = ("--subword_sampling_copies=3", "--subword_sampling_alpha=0.3")
  first = _sampling_datagen(raw, tmp_path / "one", *flags)
  assert first.returncode == 0, first.stderr
  assert ("translate_folder train: 300 pairs read, 300 kept (dropped: 0 empty_or_whitespace) "
          "-> 4 file(s)\ntranslate_folder train_sampled: 300 pairs read, 300 kept (dropped: 0 "
          "empty_or_whitespace), 3 sampled segmentations each (alpha 0.3) -> 4 file(s)"
          ) in first.stdout
  problem = registry.problem("translate_folder")
  out = str(tmp_path / "one")
  manifest = problem.manifest(out)
  assert manifest["settings"]["subword_sampling"] == {"copies": 3, "alpha": 0.3}
  vocab = problem.get_vocab(out)
  records = [r for path in problem.data_files(out, "train_sampled")
             for r in _shard_records(path)]
  assert len(records) == 900
  pairs = read_parallel(str(raw / "train.en"), str(raw / "train.de"))
  by_text = {}
  for source, target in records:
    by_text.setdefault((vocab.decode(source), vocab.decode(target)), []).append(
        (source, target))
  round_trip = [(vocab.decode(vocab.encode(s)), vocab.decode(vocab.encode(t))) for s, t in pairs]
  assert sorted(by_text) == sorted(round_trip)  # (sentencepiece's normalization of spaces)
  assert {len(v) for v in by_text.values()} == {3}
  varied = sum(len(set(copies)) > 1 for copies in by_text.values())
  one_best = {(tuple(vocab.encode(s)), tuple(vocab.encode(t))) for s, t in pairs}
  assert varied >= 200, f"{varied} of 300 pairs have one segmentation in all 3 copies"
  assert sum(r in one_best for r in records) < 600  # sampled, not the one best
  dev = _shard_records(problem.data_files(out, "dev")[0])
  assert dev == [(tuple(vocab.encode(s)), tuple(vocab.encode(t)))
                 for s, t in read_parallel(str(raw / "dev.en"), str(raw / "dev.de"))]
  from t2t_lite.data import shards
  again = [str(tmp_path / f"again-{i}.tfrecord") for i in range(4)]
  assert shards.write_shuffled(vocab, pairs, again, 300, 1, copies=3, sampling_alpha=0.3) == 900
  # The same seed in this process draws what the datagen process drew: the same bytes.
  assert ([open(path, "rb").read() for path in again]
          == [open(path, "rb").read() for path in problem.data_files(out, "train_sampled")])
  assert shards.write_shuffled(vocab, pairs, again, 300, 1) == 300  # as without sampling
  assert ([open(path, "rb").read() for path in again]
          == [open(path, "rb").read() for path in problem.data_files(out, "train")])
  assert "nothing to do" in _sampling_datagen(raw, tmp_path / "one", *flags).stdout


def test_subword_sampling_flags_are_checked_and_a_change_is_refused_unasked(tmp_path):
  """Bad values are usage errors that write nothing; data of older manifests is one
  segmentation; asking an existing --data_dir for other sampling is refused, data left whole."""
  raw, out = tmp_path / "raw", tmp_path / "out"
  _corpus(raw)
  for flags, message in (
      (["--subword_sampling_copies=1", "--subword_sampling_alpha=0.3"],
       "--subword_sampling_copies=1: give 2 or more sampled segmentations"),
      (["--subword_sampling_alpha=0.3"],
       "--subword_sampling_alpha needs --subword_sampling_copies (2 or more)"),
      (["--subword_sampling_copies=4"], "--subword_sampling_alpha=0 must be in (0, 1]"),
      (["--subword_sampling_copies=4", "--subword_sampling_alpha=1.5"],
       "--subword_sampling_alpha=1.5 must be in (0, 1]")):
    _assert_usage_error(_sampling_datagen(raw, out, *flags), message, out_dir=out)
  assert _sampling_datagen(raw, out).returncode == 0
  # A manifest written before sampling existed (no `subword_sampling` in its settings) reads
  # as one segmentation: datagen with the same settings leaves the data alone.
  path = out / "translate_folder.manifest.json"
  manifest = json.loads(path.read_text())
  del manifest["settings"]["subword_sampling"]
  path.write_text(json.dumps(manifest))
  before = _digests(out)
  assert "nothing to do" in _sampling_datagen(raw, out).stdout
  assert registry.problem("translate_folder").manifest(str(out))["settings"][
      "subword_sampling"] is None
  changed = _sampling_datagen(raw, out, "--subword_sampling_copies=2",
                              "--subword_sampling_alpha=0.5")
  _assert_usage_error(changed, "made from other inputs or settings", "subword_sampling None -> "
                      "{'copies': 2, 'alpha': 0.5}", "--overwrite")
  assert _digests(out) == before


def test_sampled_data_of_the_earlier_form_is_kept_unless_overwritten_then_made_again_the_same(
    sampled_data, tmp_path):
  """Sampled data made before the one best was kept beside the sampled copies (its "train"
  split held the copies) is not up to date, but runs may be reading it: datagen with the same
  settings refuses to replace it (exit 2, data left whole); with --overwrite it makes it
  again, with the one best as "train" and the very same sampled records as "train_sampled"."""
  from conftest import SAMPLED_DATAGEN
  data_dir = tmp_path / "data"
  shutil.copytree(sampled_data, data_dir)
  path = data_dir / "translate_ende_multi30k.manifest.json"
  manifest = json.loads(path.read_text())
  problem = registry.problem("translate_ende_multi30k")
  sampled = [open(f, "rb").read() for f in problem.data_files(str(data_dir), "train_sampled")]
  one_best = [open(f, "rb").read() for f in problem.data_files(str(data_dir), "train")]
  manifest["splits"]["train"] = manifest["splits"].pop("train_sampled")
  path.write_text(json.dumps(manifest))
  assert sorted(problem.manifest(str(data_dir))["splits"]) == ["dev", "test", "train_sampled"]
  before = _digests(data_dir)
  datagen = ("t2t-lite-datagen", *SAMPLED_DATAGEN, f"--data_dir={data_dir}",
             f"--tmp_dir={data_dir / 'raw'}")
  _assert_usage_error(cli(*datagen), "made from other inputs or settings (the sampled copies "
                      "without the one best (an earlier datagen) -> both)", "--overwrite")
  assert _digests(data_dir) == before
  again = cli(*datagen, "--overwrite")
  assert again.returncode == 0 and "nothing to do" not in again.stdout, again.stderr[-2000:]
  assert sorted(problem.manifest(str(data_dir))["splits"]) == [
      "dev", "test", "train", "train_sampled"]
  for split, records in (("train_sampled", sampled), ("train", one_best)):
    assert [open(f, "rb").read() for f in problem.data_files(str(data_dir), split)] == records
  assert not os.path.exists(data_dir / manifest["dir"])  # the earlier folder is removed


def test_data_made_before_the_store_is_refused_by_the_trainer_and_completed_by_datagen(
    sampled_data, tmp_path):
  """Data of an earlier datagen has no store of its training splits: the trainer refuses it
  before TensorFlow starts, with the command that completes it; that command (the same
  datagen again) adds the stores of both training splits beside the records, which it leaves
  as they were, and the trainer then reads it."""
  from conftest import NO_EVAL_FLAGS, SAMPLED_DATAGEN
  problem = registry.problem("translate_ende_multi30k")
  data_dir = tmp_path / "data"
  shutil.copytree(sampled_data, data_dir)
  manifest_path = data_dir / "translate_ende_multi30k.manifest.json"
  manifest = json.loads(manifest_path.read_text())
  for split in ("train", "train_sampled"):
    for name in manifest["splits"][split].pop("store")["files"]:
      (data_dir / manifest["dir"] / name).unlink()
  manifest_path.write_text(json.dumps(manifest))
  before = _digests(data_dir)
  result = cli("t2t-lite-trainer", *NO_EVAL_FLAGS, f"--data_dir={data_dir}",
               f"--output_dir={tmp_path / 'run'}", "--train_steps=2")
  _assert_usage_error(result, f"{data_dir} was made by an earlier t2t-lite-datagen, without "
                      "the store of its 'train' split that training reads by index; run the "
                      "same t2t-lite-datagen command again")
  added = cli("t2t-lite-datagen", *SAMPLED_DATAGEN, f"--data_dir={data_dir}",
              f"--tmp_dir={data_dir / 'raw'}", check=True)
  assert ("added the store that training reads of train, train_sampled" in added.stdout)
  after = _digests(data_dir)
  assert {k: v for k, v in after.items() if k in before and "manifest" not in k} == {
      k: v for k, v in before.items() if "manifest" not in k}
  assert sorted(set(after) - set(before)) == sorted(
      f"{manifest['dir']}/translate_ende_multi30k-{split}.{part}"
      for split in ("train", "train_sampled")
      for part in ("lengths.npy", "offsets.npy", "inputs.ids", "targets.ids"))
  fresh = problem.manifest(sampled_data)["splits"]
  again = problem.manifest(str(data_dir))["splits"]
  assert all(again[split]["store"] == fresh[split]["store"] for split in ("train", "train_sampled"))
  assert "nothing to do" in cli("t2t-lite-datagen", *SAMPLED_DATAGEN, f"--data_dir={data_dir}",
                                f"--tmp_dir={data_dir / 'raw'}", check=True).stdout
  cli("t2t-lite-trainer", *NO_EVAL_FLAGS, f"--data_dir={data_dir}",
      f"--output_dir={tmp_path / 'run'}", "--train_steps=2", check=True)


def test_a_damaged_manifest_is_a_usage_error_naming_it(multi30k_data, tmp_path):
  data_dir = tmp_path / "data"
  shutil.copytree(multi30k_data, data_dir)
  manifest = data_dir / "translate_ende_multi30k.manifest.json"
  problem = registry.problem("translate_ende_multi30k")
  for damage in ("[]", '{"splits": 3}', "{not json"):
    manifest.write_text(damage)
    with pytest.raises(UsageError, match=f"{manifest} is not a t2t-lite-datagen manifest"):
      problem.snapshot(str(data_dir))
