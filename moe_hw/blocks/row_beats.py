"""The beat counter of a row: which beat of the current row is in hand, and whether it is the
row's last, as a register.

A row of H elements moves in ``beats = ceil(H / lanes)`` beats. The last-beat test
``beat == beats - 1`` is a subtraction and a compare; when it feeds a ready signal it sits in
front of a pipeline's clock-enable fan-out. Here it is computed ahead and registered, so that
``last`` costs a flip-flop's delay; and so is the flag for the beat after the one in hand, so
that ``last``'s own next value is a choice among registers (by the step and the start), with
no compare between the step and the flag.

``beats`` is the per-run beat count: it must hold its value from the cycle of the first
``start`` on, and for at least one cycle before the first ``step``.

With ``wrap``, a step on a row's last beat starts the next row by itself (the count goes
back to beat 0, the flags to a new row's), so that a caller whose rows follow one another
needs ``start`` only once, at the beginning: the counter's clock enable is then the step
alone, not the step gated with "a next row is there".
"""

from amaranth.hdl import Mux, Signal

__all__ = ["row_beats"]


def row_beats(m, beats, *, start, step, name="row", wrap=False):
    """Count the beats of a row. ``start`` (a new row begins: its first beat is in hand) wins
    over ``step`` (the beat in hand is taken; the next one of the same row is in hand) in the
    same cycle. Returns ``(beat, last)``: the index of the beat in hand and the registered
    "it is the row's last" flag. ``wrap``: a step on the last beat starts a new row."""
    beat = Signal.like(beats, name=f"{name}_beat")
    last = Signal(name=f"{name}_last")               # beat == beats - 1
    next_last = Signal(name=f"{name}_next_last")     # beat == beats - 2
    third_last = Signal.like(beats, name=f"{name}_third_last")
    m.d.sync += third_last.eq(beats - 3)             # modulo 2**width, like ``beat``
    with m.If(step):
        if wrap:
            m.d.sync += [beat.eq(Mux(last, 0, beat + 1)),
                         last.eq(Mux(last, beats == 1, next_last)),
                         next_last.eq(Mux(last, beats == 2, beat == third_last))]
        else:
            m.d.sync += [beat.eq(beat + 1), last.eq(next_last),
                         next_last.eq(beat == third_last)]
    with m.If(start):
        m.d.sync += [beat.eq(0), last.eq(beats == 1), next_last.eq(beats == 2)]
    return beat, last
