"""How the llamacpp engine turns token bytes into streamed text (no model needed)."""

from __future__ import annotations

from switchyard.engines.llamacpp import _TextStream, image_placeholder


def stream(pieces: list[bytes], stops: list[str]) -> tuple[list[str], bool]:
    out = _TextStream(stops)
    texts = [out.feed(p) for p in pieces]
    texts.append(out.flush())
    return texts, out.stopped


def test_text_passes_through_without_stops() -> None:
    texts, stopped = stream([b"Hello", b" world"], [])
    assert texts == ["Hello", " world", ""] and not stopped


def test_a_character_split_across_tokens_waits_for_its_last_byte() -> None:
    snowman = "☃".encode()
    texts, _ = stream([b"a" + snowman[:1], snowman[1:2], snowman[2:] + b"b"], [])
    assert texts == ["a", "", "☃b", ""]


def test_a_stop_string_split_across_tokens_is_held_back_then_cut() -> None:
    texts, stopped = stream([b"one ", b"EN", b"D two"], ["END"])
    assert texts == ["one ", "", "", ""] and stopped


def test_held_text_that_is_not_a_stop_is_released() -> None:
    texts, stopped = stream([b"one E", b"ND", b"!"], ["ENX"])
    assert "".join(texts) == "one END!" and not stopped
    assert texts[0] == "one "  # "E" waited: it might have begun "ENX"


def test_text_before_a_stop_in_the_same_token_is_kept() -> None:
    texts, stopped = stream([b"yes\n\nmore"], ["\n\n"])
    assert texts == ["yes", ""] and stopped


def test_image_placeholder_carries_the_hash() -> None:
    assert image_placeholder("ab" * 8) == "<image:abababababababab>"
