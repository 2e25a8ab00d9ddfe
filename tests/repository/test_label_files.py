"""An output's label file (config `labels`, Triton's `label_filename`): an edit of it is a change
of the model, reloaded by a poll and by a load request; and it may sit in a folder below the
model's, as in Triton, but not outside it.

Found by a tester (t77 repro_6.py, repro_2.py): the reload fingerprint covered the version
folders and the config file, not the label file, so classification answered the old labels for
good after `labels.txt` was rewritten; and `label_filename: "labels/l.txt"` was refused as "must
be a file name in the model's folder", which Triton serves.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from repo_models import age, scale_model, write_version
from repo_models import run_on_engine as run

from duetime.engine import Engine
from duetime.errors import ConfigError
from duetime.repository.layout import scan_model
from duetime.repository.loader import LoadedModel, load_version
from duetime.repository.manager import fingerprint
from duetime.repository.tritonconfig import load_model_config

pytestmark = pytest.mark.timeout(60)


def classifier(repo: Path, labels: str = "labels.txt") -> Path:
    """Model `m` (version 1) whose output `y` has the labels of file `labels` (cat, dog; the
    file written where it is in the model's folder)."""
    write_version(repo, "m", 1, scale_model(1))
    config = repo / "m" / "config.pbtxt"
    config.write_text(f'max_batch_size: 4\noutput [ {{ name: "y" label_filename: "{labels}" }} ]\n')
    age(config)
    path = Path(os.path.normpath(repo / "m" / labels))
    if path.is_relative_to(repo / "m") and path != repo / "m":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("cat\ndog\n")
        age(path)
    return path


def labels_served(engine: Engine) -> tuple[str, ...]:
    served = engine.registry.snapshot.models["m"].versions["1"]
    return served.primary.model.labels["y"]


# -- an edit of the label file is a change of the model -----------------------------------------


def test_the_fingerprint_covers_the_label_file(tmp_path: Path) -> None:
    path = classifier(tmp_path)
    source = scan_model(tmp_path / "m")
    config = load_model_config(tmp_path / "m")
    before = fingerprint(source, 1, config)
    assert str(path) in [name for name, *_ in before.files]
    path.write_text("CAT\nDOG\n")
    age(path)  # (its time set back: the inode's change time still tells)
    assert fingerprint(source, 1, config) != before
    path.unlink()
    assert str(path) not in [name for name, *_ in fingerprint(source, 1, config).files]


def test_a_poll_serves_the_edited_labels(tmp_path: Path) -> None:
    path = classifier(tmp_path)

    async def scenario(engine: Engine) -> None:
        assert engine.manager is not None
        assert labels_served(engine) == ("cat", "dog")
        path.write_text("CAT\nDOG\n")
        age(path)
        await engine.manager.poll()
        assert labels_served(engine) == ("CAT", "DOG")

    run(tmp_path, scenario, control_mode="poll", poll_s=3600)


def test_a_load_request_serves_the_edited_labels(tmp_path: Path) -> None:
    path = classifier(tmp_path)

    async def scenario(engine: Engine) -> None:
        assert engine.manager is not None
        await engine.manager.load("m")
        assert labels_served(engine) == ("cat", "dog")
        path.write_text("CAT\nDOG\nEAGLE\n")
        age(path)
        await engine.manager.load("m")
        assert labels_served(engine) == ("CAT", "DOG", "EAGLE")

    run(tmp_path, scenario, control_mode="explicit")


# -- a label file below the model's folder, not outside it -------------------------------------


@pytest.mark.parametrize("name", ["labels/l.txt", "a/b/l.txt", "./l.txt"])
def test_a_label_file_in_a_folder_below_the_models_is_read(
    tmp_path: Path, name: str, loaded: list[LoadedModel]
) -> None:
    classifier(tmp_path, name)
    model = load_version(scan_model(tmp_path / "m"), 1)
    loaded.append(model)
    assert model.labels == {"y": ("cat", "dog")}


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("../l.txt", "'..' leaves the folder"),
        ("labels/../../l.txt", "'..' leaves the folder"),
        ("..", "'..' leaves the folder"),
        ("/etc/hostname", "an absolute path leaves it"),
        ("labels\\\\l.txt", "'\\' is no folder separator here; write '/'"),
    ],
)
def test_a_label_path_leaving_the_models_folder_is_refused(
    tmp_path: Path, name: str, said: str
) -> None:
    classifier(tmp_path, name)
    (tmp_path / "l.txt").write_text("out\nside\n")
    with pytest.raises(ConfigError) as caught:
        load_version(scan_model(tmp_path / "m"), 1)
    shown = name.replace("\\\\", "\\")
    assert caught.value.message.startswith(
        f"{tmp_path / 'm'}: field 'outputs.0.labels': '{shown}' must "
        "be a file name in the model's folder or in a folder below it (such as "
        "labels/classes.txt), as in Triton"
    )
    assert caught.value.message.endswith(said)
