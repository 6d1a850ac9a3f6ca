"""The static half of fingerprint_match's generation-settings comparison, on plain dicts: an EOS that
is an id or a list (as Qwen's and Llama 3's generation configs name several), pad/BOS ids, bans."""

from __future__ import annotations

from typing import Any

import pytest

from mmchaos.checks.integration._generation_settings import id_set, settings_problems


class _Tokenizer:
    """Just what the comparison reads of a tokenizer: its special ids and their names."""

    eos_token_id, pad_token_id, bos_token_id = 257, 258, 256

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return {256: "<s>", 257: "</s>", 258: "<pad>"}.get(token_id, f"<{token_id}>")


CONFIG = {"text_config": {"eos_token_id": 257, "pad_token_id": 258, "bos_token_id": 256}}


def _problems(**generation: Any) -> list[str]:
    return [m for _, m in settings_problems({"bos_token_id": 256, "pad_token_id": 258, **generation}, CONFIG,
                                            _Tokenizer()).problems]  # fmt: skip


@pytest.mark.parametrize("eos", [257, [257], [1, 257]])
def test_an_eos_that_includes_the_tokenizers_passes(eos: Any) -> None:
    assert _problems(eos_token_id=eos) == []


@pytest.mark.parametrize("eos", [0, [0, 5]])
def test_an_eos_that_leaves_out_the_tokenizers_is_named(eos: Any) -> None:
    (problem,) = _problems(eos_token_id=eos)
    assert f"eos_token_id is {eos!r}" in problem and "id 257 ('</s>')" in problem


def test_no_eos_at_all_is_named() -> None:
    (problem,) = _problems(eos_token_id=None)
    assert "names no eos_token_id" in problem


def test_pad_and_bos_must_agree_where_both_name_one() -> None:
    problems = _problems(eos_token_id=257, pad_token_id=0, bos_token_id=9)
    assert [p.split(" is ")[0] for p in problems] == [
        "generation_config.pad_token_id",
        "generation_config.bos_token_id",
    ]
    assert _problems(eos_token_id=257, pad_token_id=None, bos_token_id=None) == []


def test_a_banned_eos_is_named_and_defaults_are_recorded() -> None:
    found = settings_problems({"eos_token_id": [257], "suppress_tokens": [257], "temperature": 0.7}, CONFIG,
                              _Tokenizer())  # fmt: skip
    assert [m for _, m in found.problems] == [
        "generation_config.suppress_tokens bans EOS id 257: no answer can end before max_new_tokens"
    ]
    assert found.facts["defaults"] == {"temperature": 0.7} and found.fixes


def test_id_set_reads_every_shape_generation_configs_use() -> None:
    assert id_set(None) == set() and id_set(True) == set()
    assert id_set(3) == {3} and id_set([3, [4, 5]]) == {3, 4, 5}
