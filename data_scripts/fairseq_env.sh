#!/usr/bin/env bash
# A Python environment with fairseq 0.12.2 (its last release) and PyTorch, for
# `make bench-fairseq` (benchmarks/fairseq.py). fairseq is not a dependency of t2t-lite.
# Usage: fairseq_env.sh DIR     then: make bench-fairseq FAIRSEQ_BIN=DIR/bin
#
# fairseq 0.12.2 does not install on Python 3.11 as published. This script:
#  - keeps pip below 24.1, which refuses the metadata of omegaconf 2.0.6 (fairseq pins
#    omegaconf < 2.1 and hydra-core < 1.1);
#  - builds fairseq without its PyTorch C++ extensions, some of whose sources the source
#    release lacks (they serve BASE layers, non-autoregressive models and alignment training,
#    none of which the comparison uses), and without torchaudio (speech only);
#  - turns dataclass fields whose default is an instance, which Python 3.11 refuses, into
#    default_factory fields, in fairseq and in hydra-core 1.0.7, and lets fairseq's config
#    store read such fields.
set -euo pipefail
dir=${1:?usage: fairseq_env.sh DIR}
python=${PYTHON:-python3}

"$python" -m venv "$dir"
"$dir/bin/pip" install -q "pip<24.1"
"$dir/bin/pip" install -q "setuptools==84.2.1" wheel "cython==3.3.1" "numpy==1.26.4" "torch==2.14.1"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
"$dir/bin/pip" download -q --no-deps --no-build-isolation -d "$src" "fairseq==0.12.2"
tar xzf "$src/fairseq-0.12.2.tar.gz" -C "$src"

# Instance defaults -> default_factory; in fairseq's sources, then in the installed hydra.
fix_defaults='
import re, sys
for path in sys.argv[1:]:
    text = open(path).read()
    text = re.sub(r"^(\s+\w+: (\w+)) = \2\(\)$", r"\1 = field(default_factory=\2)", text, flags=re.M)
    text = re.sub(r"field\(default=(\w+)\(\)\)", r"field(default_factory=\1)", text)
    open(path, "w").write(text)
'
(
  cd "$src/fairseq-0.12.2"
  "$python" - setup.py <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
text = text.replace("    from torch.utils import cpp_extension\n",
                    "    raise ImportError('built without the C++ extensions')\n")
text = text.replace('"torchaudio>=0.8.0",', "")
open(path, "w").write(text)
EOF
  "$python" -c "$fix_defaults" fairseq/dataclass/configs.py \
    fairseq/models/transformer/transformer_config.py
  "$python" - fairseq/dataclass/initialize.py <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
old = "        v = FairseqConfig.__dataclass_fields__[k].default\n"
assert old in text, path
text = text.replace(old, "        field = FairseqConfig.__dataclass_fields__[k]\n"
                         "        v = field.default_factory() if callable(field.default_factory)"
                         " else field.default\n")
open(path, "w").write(text)
EOF
)
"$dir/bin/pip" install -q --no-build-isolation "$src/fairseq-0.12.2"
site=$("$dir/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
hydra_conf=$site/hydra/conf/__init__.py  # importing hydra would fail before the fix
"$python" -c "$fix_defaults" "$hydra_conf"
"$dir/bin/fairseq-train" --help > /dev/null
echo "fairseq 0.12.2 in $dir: make bench-fairseq FAIRSEQ_BIN=$dir/bin"
