"""A config.yaml giving a key twice is refused, naming the key and both lines, as TOML and
protobuf's text format refuse the same mistake.

Found by a tester (repro_yaml_duplicate_keys.py): `yaml.safe_load` kept the last value without a
word (two `scheduling:` blocks lost the first one's settings).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from duetime.config import read_config_file
from duetime.errors import ConfigError


def read(tmp_path: Path, text: str) -> dict[str, object]:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return read_config_file(path)


@pytest.mark.parametrize(
    ("text", "key", "line", "first"),
    [
        ("max_batch_size: 4\ninstances: 1\nmax_batch_size: 8\n", "max_batch_size", 3, 1),
        ("scheduling:\n  max_queue_size: 10\nscheduling:\n  policy: fifo\n", "scheduling", 3, 1),
        ("scheduling:\n  policy: edf\n  policy: fifo\n", "policy", 3, 2),
        ("inputs:\n  - name: x\n    dims: [4]\n    name: y\n", "name", 4, 2),
        ("{max_batch_size: 4, max_batch_size: 8}\n", "max_batch_size", 1, 1),
    ],
    ids=["top", "section", "nested", "in-a-list", "flow"],
)
def test_a_key_given_twice_is_refused_naming_it_and_its_lines(
    tmp_path: Path, text: str, key: str, line: int, first: int
) -> None:
    with pytest.raises(ConfigError) as caught:
        read(tmp_path, text)
    assert caught.value.message == (
        f"{tmp_path / 'config.yaml'}: cannot be read as YAML: line {line}: key '{key}' given "
        f"again (first on line {first}); keep one"
    )


def test_keys_merged_in_may_be_overridden(tmp_path: Path) -> None:
    """YAML's `<<` merge: a key of the mapping itself overrides one merged in (no mistake)."""
    text = (
        "base: &base\n  policy: edf\n  max_queue_size: 8\n"
        "scheduling:\n  <<: *base\n  policy: fifo\n"
    )
    data = read(tmp_path, text)
    assert data["scheduling"] == {"policy": "fifo", "max_queue_size": 8}


def test_distinct_keys_read_as_before(tmp_path: Path) -> None:
    text = "max_batch_size: 4\nscheduling:\n  policy: fifo\n  max_queue_size: 10\n"
    assert read(tmp_path, text) == {
        "max_batch_size": 4,
        "scheduling": {"policy": "fifo", "max_queue_size": 10},
    }
