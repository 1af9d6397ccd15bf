import json

import pytest

from t2t_lite.core.errors import UsageError
from t2t_lite.core.hparams import HParams, HParamsError


def make():
  return HParams(batch_size=4096, learning_rate=0.1, shared=True, schedule="constant")


def test_parse_converts_by_declared_type():
  hparams = make()
  applied = hparams.parse("batch_size=2048,learning_rate=2.5,shared=false,schedule=rsqrt_decay")
  assert applied == {"batch_size": 2048, "learning_rate": 2.5, "shared": False,
                     "schedule": "rsqrt_decay"}
  assert type(hparams.batch_size) is int and hparams.batch_size == 2048
  assert type(hparams.learning_rate) is float and hparams.learning_rate == 2.5
  assert hparams.shared is False
  hparams.parse("learning_rate=3,batch_size=1e3,shared=TRUE")
  assert hparams.learning_rate == 3.0 and type(hparams.learning_rate) is float
  assert hparams.batch_size == 1000 and hparams.shared is True


def test_unknown_name_suggests_closest():
  with pytest.raises(HParamsError, match=r"unknown hparam 'batch_sise'; did you mean batch_size"):
    make().parse("batch_sise=2048")
  assert issubclass(HParamsError, UsageError)


@pytest.mark.parametrize("spec, message", [
    ("batch_size=2.5", "hparam 'batch_size' is int; cannot set it to '2.5'"),
    ("batch_size=big", "hparam 'batch_size' is int; cannot set it to 'big'"),
    ("learning_rate=fast", "hparam 'learning_rate' is float; cannot set it to 'fast'"),
    ("shared=maybe", "hparam 'shared' is bool; cannot set it to 'maybe'"),
])
def test_wrong_type_names_hparam_type_and_value(spec, message):
  with pytest.raises(HParamsError) as info:
    make().parse(spec)
  assert str(info.value) == message


@pytest.mark.parametrize("spec", ["batch_size", "=3", "batch_size=1,,oops"])
def test_malformed_entries(spec):
  with pytest.raises(HParamsError, match="malformed --hparams entry"):
    make().parse(spec)


def test_json_round_trip_keeps_types():
  hparams = make()
  hparams.parse("learning_rate=0.25")
  again = HParams.from_json(hparams.to_json())
  assert again == hparams
  assert json.loads(again.to_json())["learning_rate"] == 0.25
  assert type(again.batch_size) is int and type(again.learning_rate) is float


def test_attribute_assignment_is_type_checked():
  hparams = make()
  hparams.batch_size = 3.0
  assert hparams.batch_size == 3 and type(hparams.batch_size) is int
  with pytest.raises(HParamsError):
    hparams.batch_size = 3.5
  with pytest.raises(HParamsError, match="unknown hparam"):
    hparams.no_such = 1
