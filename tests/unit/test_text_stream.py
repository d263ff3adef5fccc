"""Stop strings and UTF-8 reassembly, without a model."""

from __future__ import annotations

from raygate.backends.engines.text_stream import StopMatcher, Utf8Stream


def run(stops: list[str], pieces: list[str]) -> tuple[str, bool]:
    matcher = StopMatcher(stops)
    out = []
    for piece in pieces:
        text, hit = matcher.push(piece)
        out.append(text)
        if hit:
            return "".join(out), True
    return "".join(out) + matcher.flush(), False


def test_stop_split_across_pieces_never_leaks() -> None:
    assert run(["END"], ["Hello E", "N", "D tail"]) == ("Hello ", True)


def test_false_start_is_released() -> None:
    assert run(["END"], ["Hello E", "NOUGH"]) == ("Hello ENOUGH", False)


def test_earliest_of_several_stops_wins() -> None:
    assert run(["b", "abc"], ["xxabc"]) == ("xx", True)


def test_no_stops_passes_through() -> None:
    assert run([], ["a", "b"]) == ("ab", False)


def test_held_prefix_flushed_at_end() -> None:
    assert run(["STOP"], ["abc ST"]) == ("abc ST", False)


def test_utf8_split_multibyte() -> None:
    data = "héllo 🙂".encode()
    stream = Utf8Stream()
    out = "".join(stream.push(data[i : i + 1]) for i in range(len(data))) + stream.flush()
    assert out == "héllo 🙂"
