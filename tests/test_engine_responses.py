"""`Engine.infer_response(_async)`: the whole answer in process (which version and variant
answered), and request `parameters` (a traffic policy's sticky key) as over HTTP and gRPC: the
in-process API gave the outputs alone, and no way to pass a sticky key short of building an
InferRequest for `Engine.submit`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from repo_models import inputs, scale_model, write_version

from duetime import Engine
from duetime.errors import InvalidInput

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def ab_repo(tmp_path: Path) -> Path:
    """Model 'm': version 1 answers x, version 2 answers 2x, split half and half by a sticky
    key 'user'."""
    write_version(tmp_path, "m", 1, scale_model(1.0))
    write_version(tmp_path, "m", 2, scale_model(2.0))
    (tmp_path / "m" / "config.toml").write_text(
        '[version_policy.all]\n\n[traffic]\nweights = { "1" = 1.0, "2" = 1.0 }\n'
        'sticky_key = "user"\n'
    )
    return tmp_path


def test_the_answer_says_which_version_answered_and_a_sticky_key_keeps_it(
    ab_repo: Path,
) -> None:
    with Engine.open(ab_repo) as engine:
        seen: dict[str, set[str]] = {}
        for user in (f"u{i}" for i in range(24)):
            for _ in range(3):
                response = engine.infer_response("m", inputs(), parameters={"user": user})
                factor = float(response.outputs["y"][0, 0] / inputs()["x"][0, 0])
                assert factor == float(response.version)  # (the version said is the one that ran)
                assert response.model == "m"
                assert response.variant == "default"
                seen.setdefault(user, set()).add(response.version)
        assert all(len(versions) == 1 for versions in seen.values())  # sticky
        assert set().union(*seen.values()) == {"1", "2"}  # both arms serve someone
        outputs = engine.infer("m", inputs(), parameters={"user": "u0"})
        assert float(outputs["y"][0, 0]) == float(next(iter(seen["u0"])))


def test_the_async_answer_is_whole_on_the_engines_loop_and_from_another(ab_repo: Path) -> None:
    async def on_its_loop() -> None:
        engine = await Engine.start(ab_repo)
        try:
            response = await engine.infer_response_async("m", inputs(), version=2)
            assert (response.version, float(response.outputs["y"][0, 0])) == ("2", 2.0)
        finally:
            await engine.aclose()

    asyncio.run(on_its_loop())
    with Engine.open(ab_repo) as engine:
        response = asyncio.run(engine.infer_response_async("m", inputs(), version=1))
        assert (response.version, float(response.outputs["y"][0, 0])) == ("1", 1.0)


def test_parameters_that_are_no_mapping_are_refused_naming_the_argument(ab_repo: Path) -> None:
    with (
        Engine.open(ab_repo) as engine,
        pytest.raises(InvalidInput, match="parameters: expected a mapping"),
    ):
        engine.infer("m", inputs(), parameters=["user"])  # type: ignore[arg-type]
