"""Atomic writes: synced before and after the rename; temporaries tagged by host and pid."""

import os
import re

import pytest

from t2t_lite.core import files
from t2t_lite.data.problems import base

GONE = 999999999  # no such process


def test_write_atomic_syncs_the_file_before_the_rename_and_the_folder_after(tmp_path,
                                                                             monkeypatch):
  events = []
  real_fsync, real_replace = os.fsync, os.replace
  monkeypatch.setattr(os, "fsync", lambda fd: events.append(
      ("fsync", os.readlink(f"/proc/self/fd/{fd}"))) or real_fsync(fd))
  monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", b)) or
                      real_replace(a, b))
  target = tmp_path / "record.json"
  files.write_atomic(str(target), "{}")
  assert target.read_text() == "{}"
  tmp = f"{target}.tmp-{files.writer_tag()}"
  assert events == [("fsync", tmp), ("replace", str(target)), ("fsync", str(tmp_path))]


def test_only_temporaries_of_this_hosts_stopped_processes_are_stale():
  here = files.writer_tag().rpartition("-")[0]
  assert files.stale(f"{here}-{GONE}") and files.stale(str(GONE))  # (a name of before)
  assert not files.stale(f"otherhost-{GONE}")  # its pid means nothing here
  assert not files.stale(files.writer_tag()) and not files.stale(f"{here}-1")  # running


def test_datagen_leaves_what_a_datagen_on_another_node_is_writing(tmp_path):
  here = files.writer_tag().rpartition("-")[0]
  names = {"translate_folder.manifest.json.tmp-otherhost-{}": True,
           "translate_folder.manifest.json.tmp-%s-{}" % here: False,
           "translate_folder.data-1700000000-otherhost-{}": True,
           "translate_folder.data-1700000000-%s-{}" % here: False,
           "translate_folder.data-1700000000-{}": False}
  for name in names:
    path = tmp_path / name.format(GONE)
    path.mkdir() if ".data-" in name else path.write_text("partial")
  base._remove_stale_temporaries(str(tmp_path), "translate_folder", None)
  assert sorted(os.listdir(tmp_path)) == sorted(name.format(GONE) for name, kept in
                                                names.items() if kept)


@pytest.fixture
def hostname(monkeypatch):
  """Sets the name this process reads as its host's (`hostname(name)`); the cached tag is
  dropped before and after."""
  def set_name(name):
    monkeypatch.setattr(files.socket, "gethostname", lambda: name)
    files._host.cache_clear()
  yield set_name
  monkeypatch.undo()
  files._host.cache_clear()


def test_hosts_whose_names_differ_in_punctuation_alone_have_different_tags(hostname):
  tags = {}
  for name in ("node-1", "node.1", "node_1", "node1", "", "n\u00f6de-1"):
    hostname(name)
    tags[name] = files._host()
    assert re.fullmatch(files.TAG, f"{tags[name]}-{GONE}") and "-" not in tags[name]
  assert len(set(tags.values())) == len(tags), tags
  assert tags["node1"] == "node1"  # letters and digits alone: the name as it is
  hostname("node.1")
  assert files._host() == tags["node.1"]  # the same on every call (and every process)


def test_a_writer_on_a_host_whose_name_differs_in_punctuation_is_not_stale(hostname):
  hostname("node.1")
  theirs = f"{files._host()}-{GONE}"
  assert files.stale(theirs)  # on its own host, a writer that is gone
  hostname("node-1")
  assert not files.stale(theirs)  # its pid means nothing here
  assert files.stale(f"{files._host()}-{GONE}")
