"""The serving layer: one class per endpoint on a shared base (`base.py`); routes stay thin.

What only this layer uses lives here too: the model handle every engine call goes through
(`handle.py`: admission, deadlines `deadlines.py`, metrics `call_recorder.py`), per-model
admission (`admission.py`), fan-out of several sequences (`fanout.py`), SSE (`streaming.py`) and
the ids the gateway mints (`ids.py`)."""
