"""Models. Importing this package registers them."""

from t2t_lite.models import transformer  # noqa: F401
