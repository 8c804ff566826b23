"""testbed/incidents.py recording_span: phase times as seconds from a real recording's first scrape."""

from pathlib import Path

from kvscope.agent.recording.omfile import read_recording
from testbed.incidents import recording_span

RECORDING = Path(__file__).resolve().parents[1] / "recordings" / "kv-pressure-cascade.om.gz"


def test_phases_are_placed_in_seconds_from_the_first_scrape():
    scrapes, _ = read_recording(RECORDING)
    first, last = min(s.timestamp for s in scrapes), max(s.timestamp for s in scrapes)
    phases = [{"name": "load", "start_unix": first + 10.04, "end_unix": first + 70.0}]
    assert recording_span(RECORDING, phases) == (first, last)
    assert phases == [{"name": "load", "start_s": 10.0, "end_s": 70.0}]
