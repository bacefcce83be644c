"""The GGUF's config and tokenizer are converted once and read back from the cache unchanged."""

from __future__ import annotations

import logging

from conftest import smollm_gguf_path

from llm_engine.loader.gguf_conversion import _save, config_and_tokenizer, converted_folder

TEXTS = ["def f(x):\n    return x  # ünïcode 🎉 中文", "<|im_start|>user\nhi<|im_end|>\n", "\t  tabs  and spaces ", ""]


def test_the_cached_conversion_is_the_conversion(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CODEYARD_CACHE_DIR", str(tmp_path))
    path = smollm_gguf_path()
    converted_config, converted_tokenizer = config_and_tokenizer(path)  # a miss: Transformers' own conversion
    folder = converted_folder(path)
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    cached_config, cached_tokenizer = config_and_tokenizer(path)
    assert cached_config.to_dict() | {"_name_or_path": ""} == converted_config.to_dict() | {"_name_or_path": ""}
    for text in TEXTS:
        assert cached_tokenizer(text).input_ids == converted_tokenizer(text).input_ids
    every_seventh = list(range(0, len(converted_tokenizer), 7))
    assert cached_tokenizer.convert_ids_to_tokens(every_seventh) == converted_tokenizer.convert_ids_to_tokens(every_seventh)
    assert cached_tokenizer.all_special_ids == converted_tokenizer.all_special_ids
    chat = [{"role": "user", "content": "hi"}]
    assert (cached_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
            == converted_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))

    other = tmp_path / "other.gguf"  # another file (or this one changed): another folder
    other.write_bytes(b"not read")
    assert converted_folder(other) != folder

    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("CODEYARD_CACHE_DIR", str(blocked))
    with caplog.at_level(logging.WARNING, "llm_engine.loader.gguf_conversion"):
        _save(converted_folder(path), converted_config, converted_tokenizer)  # unwritable: a warning, no error
    assert "not cached" in caplog.text
