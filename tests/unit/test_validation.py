"""The validation rules as pure functions, and the CLI path sharing them."""

from __future__ import annotations

import pytest

from controlplane.runtime import spec, validation
from controlplane.runtime.errors import InvalidArgument, ResourceExhausted


def test_short_quotes_a_prefix_only() -> None:
    assert validation.short("abc") == "'abc'"
    long = "x" * 10_000
    out = validation.short(long)
    assert out == repr("x" * validation.QUOTE_CHARS) + "…"
    assert validation.short(b"\x00" * 100).endswith("…")
    assert len(validation.short(list(range(1000)))) <= validation.QUOTE_CHARS + 3


def test_key_is_plain_when_short_and_plain_else_quoted() -> None:
    assert validation.key("cpus") == "cpus"
    assert validation.key("a b") == "'a b'"
    assert validation.key("k" * 100).endswith("…")
    assert validation.key(7) == "7"


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a", True),
        ("a-1", True),
        ("a" * 63, True),
        ("a" * 64, False),
        ("1a", False),
        ("a-", False),
        ("A", False),
        ("", False),
        ("a_b", False),
        ("a\nb", False),
    ],
)
def test_names_are_dns_1123_labels(name: str, ok: bool) -> None:
    if ok:
        assert validation.check_name("name", name) == name
    else:
        with pytest.raises(InvalidArgument) as e:
            validation.check_name("name", name)
        assert e.value.message.startswith("name: ")


def test_ids_are_bounded_and_printable() -> None:
    assert validation.check_id("request_id", "") == ""
    with pytest.raises(InvalidArgument, match=r"^lease_id: required"):
        validation.check_id("lease_id", "", required=True)
    with pytest.raises(InvalidArgument, match=r"^request_id: at most"):
        validation.check_id("request_id", "r" * (validation.MAX_ID_BYTES + 1))
    with pytest.raises(InvalidArgument, match=r"^request_id: must be printable"):
        validation.check_id("request_id", "a\x00b")


def test_an_unsigned_wraparound_gets_a_hint() -> None:
    with pytest.raises(InvalidArgument) as e:
        validation.check_range("resources.cpu_millis", 2**32 - 250, 0, 1000)
    assert "negative number" in e.value.message


def test_the_function_bound() -> None:
    validation.check_function_count(1, 2)
    with pytest.raises(ResourceExhausted, match=r"^functions: "):
        validation.check_function_count(2, 2)


def test_the_cli_path_applies_the_same_rules() -> None:
    doc = {
        "name": "f",
        "runtime": "python",
        "env": {"BIG": "v" * (validation.MAX_ENV_VALUE_BYTES + 1)},
    }
    with pytest.raises(InvalidArgument, match=r"^env.BIG: at most"):
        spec.from_dict(doc)
    with pytest.raises(InvalidArgument, match=r"^resources.cpu_millis: must be between"):
        spec.from_dict({"name": "f", "runtime": "python", "resources": {"cpu_millis": -250}})
    with pytest.raises(InvalidArgument) as e:
        spec.from_dict({"name": "n" * 100_000, "runtime": "python"})
    assert len(e.value.message) < 200
