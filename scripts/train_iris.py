"""Train the iris classifier the KServe example serves and write it as a
joblib file (scikit-learn ships the data set: no download).

    python scripts/train_iris.py examples/models/iris.joblib
    python scripts/train_iris.py --estimator tree examples/models/iris-tree.joblib

The second, a decision tree, is the inference graph examples' other
classifier (examples/graphs/).

Deterministic: the same scikit-learn version writes the same model. It
prints the file's sha256 (for the spec's `model.sha256`) and its accuracy
on a held-out quarter of the data.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
from pathlib import Path
from typing import Any

#: Fixed so that a test's model, and its predictions, are the same every run.
RANDOM_STATE = 0


#: The estimators this script trains, by --estimator.
ESTIMATORS = ("logistic", "tree")


@functools.cache
def iris() -> Any:
    """scikit-learn's iris data set (a ``Bunch``: ``data``, ``target``, the
    names), loaded once per process."""
    from sklearn.datasets import load_iris

    return load_iris()


def train(path: Path, estimator: str = "logistic") -> tuple[str, float]:
    """Train, write ``path``; return its sha256 and the held-out accuracy."""
    # Imported here: scikit-learn takes ~1 s to import, and the test modules
    # that import this one should not pay it at collection.
    import joblib
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split
    from sklearn.tree import DecisionTreeClassifier

    x, y = iris().data, iris().target
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.25, random_state=RANDOM_STATE, stratify=y
    )
    model = (
        DecisionTreeClassifier(max_depth=3, random_state=RANDOM_STATE)
        if estimator == "tree"
        else LogisticRegression(max_iter=1000, random_state=RANDOM_STATE)
    )
    model.fit(x_train, y_train)
    path.parent.mkdir(parents=True, exist_ok=True)
    joblib.dump(model, path)
    return hashlib.sha256(path.read_bytes()).hexdigest(), float(model.score(x_test, y_test))


def main() -> None:
    p = argparse.ArgumentParser(description="Train the iris classifier into a joblib file.")
    p.add_argument("path", type=Path, nargs="?", default=Path("examples/models/iris.joblib"))
    p.add_argument("--estimator", choices=ESTIMATORS, default="logistic")
    args = p.parse_args()
    sha, accuracy = train(args.path, args.estimator)
    print(f"wrote {args.path}: sha256 {sha}, held-out accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
