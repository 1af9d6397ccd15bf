"""Translation problems. Importing this package registers them."""

from t2t_lite.data.problems import folder, multi30k, wmt14  # noqa: F401
from t2t_lite.data.problems.base import TranslateProblem  # noqa: F401
