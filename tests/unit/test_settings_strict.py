"""The cluster settings file and model files are read strictly: an unknown key anywhere is
refused with its path and the nearest valid key (llmgw.strict)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet_svc.domain import errors
from fleet_svc.rpc.settings import read_roles, read_settings
from llmgw.clients.convert import InvalidValue, model_from_data

MODEL = """
models:
  - name: m
    source: hf://org/m
    {extra_model}
    profiles:
      - name: gpu
        engine: vllm
        {extra_profile}
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("modles: []\n", "modles: unknown key; did you mean models?"),
        (
            MODEL.format(extra_model="contxt_length: 8192", extra_profile=""),
            "models[0].contxt_length: unknown key; did you mean context_length?",
        ),
        (
            MODEL.format(extra_model="", extra_profile="gpu_clas: H100-80GB"),
            "models[0].profiles[0].gpu_clas: unknown key; did you mean gpu_class?",
        ),
        ("models: {m: 1}\n", "`models` is a list of models"),
        (
            MODEL.format(extra_model="context_length: lots", extra_profile=""),
            "models[0]",
        ),
    ],
)
def test_settings_mistakes_are_refused(text: str, message: str, tmp_path: Path) -> None:
    """A typo at the top, in a model or in a profile, or a value of the wrong type, is
    refused naming where; nothing is declared."""
    path = tmp_path / "settings.yaml"
    path.write_text(text)
    with pytest.raises(errors.InvalidModel) as caught:
        read_settings(path)
    assert message in caught.value.message


def test_roles_typo_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    """A misspelt role names the role meant."""
    path = tmp_path / "settings.yaml"
    path.write_text("roles:\n  admn: [alice]\n")
    with pytest.raises(errors.InvalidModel) as caught:
        read_roles(path)
    assert "roles.admn: unknown key; did you mean admin?" in caught.value.message


def test_model_file_typo_is_refused_with_a_suggestion() -> None:
    """A model file (`ctl model create`, `ctl apply -f`) is read the same way; JSON names
    (contextLength) are still accepted."""
    with pytest.raises(InvalidValue, match=r"profiles\[0\]\.replica: unknown key; did you mean"):
        model_from_data({"name": "m", "profiles": [{"name": "p", "replica": 2}]})
    assert model_from_data({"name": "m", "contextLength": 5}).context_length == 5
