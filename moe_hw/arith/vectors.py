"""Test vectors and NumPy references for the float multiplier and adder.

Shared by the Amaranth-simulator tests and the cocotb benches that run the emitted Verilog.
Everything works on raw bit patterns (``fmt.uint_dtype`` arrays); the references compute the
way NumPy does (``a * b`` and ``a + b`` in the format's dtype: for float16 and bfloat16 that is
float32 arithmetic rounded once more, which is exact for one operation).
"""

import numpy as np

from ..formats import bits_equal, float_format, from_bits, is_nan_bits, to_bits

__all__ = ["special_values", "float_test_vectors", "reference_mul", "reference_add",
           "bits_equal", "is_nan_bits", "simulate_core", "simulate_core_verilog",
           "simulate_stream"]


def _bits(fmt, exponent, fraction, sign=0):
    return (sign << (fmt.width - 1)) | (exponent << fmt.mant_bits) | fraction


def special_values(fmt):
    """Special and boundary bit patterns of ``fmt``, each with both signs.

    Zero, the extreme subnormals and normals, one and its neighbours, ties-to-even operands
    (1 + ulp, 1 + 3 ulp, 1.5, 0.5, 0.75, half an ulp of 1 and of the largest number), values
    whose square lands on the subnormal/normal boundary or just below it, values whose square
    lands on the overflow edge, Inf, a quiet NaN and a signalling-pattern NaN.
    """
    fmt = float_format(fmt)
    m, bias, top = fmt.mant_bits, fmt.bias, fmt.exp_max - 1  # top: largest finite exponent
    frac_ones = (1 << m) - 1
    half = 1 << (m - 1)
    root_min_normal = bias + (1 - bias) // 2                  # (2**emin/2)**2 == 2**emin
    root_overflow = bias + (top - bias + 1) // 2              # (2**x)**2 == 2**(emax + 1)
    magnitudes = [
        0,                                                    # zero
        1,                                                    # smallest subnormal
        2, 3, half,                                           # small and mid subnormals
        frac_ones,                                            # largest subnormal
        _bits(fmt, 1, 0),                                     # smallest normal
        _bits(fmt, 1, 1),                                     # smallest normal + ulp
        _bits(fmt, 1, frac_ones),                             # just below 2 * smallest normal
        _bits(fmt, bias, 0),                                  # 1
        _bits(fmt, bias, 1),                                  # 1 + ulp
        _bits(fmt, bias, 3),                                  # 1 + 3 ulp
        _bits(fmt, bias - 1, frac_ones),                      # 1 - ulp/2
        _bits(fmt, bias, half),                               # 1.5
        _bits(fmt, bias - 1, 0),                              # 0.5
        _bits(fmt, bias - 1, half),                           # 0.75
        _bits(fmt, bias + 1, 0),                              # 2
        _bits(fmt, bias - m - 1, 0),                          # ulp(1) / 2
        _bits(fmt, root_min_normal, 0),                       # square = smallest normal
        _bits(fmt, root_min_normal - 1, frac_ones),           # square just below it
        _bits(fmt, root_overflow, 0),                         # square overflows
        _bits(fmt, root_overflow - 1, frac_ones),             # square just below the edge
        _bits(fmt, top - m - 1, 0),                           # ulp(max) / 2
        _bits(fmt, top - m, 0),                               # ulp(max)
        _bits(fmt, top, frac_ones - 1),                       # max - ulp
        _bits(fmt, top, frac_ones),                           # largest finite
        _bits(fmt, fmt.exp_max, 0),                           # Inf
        fmt.quiet_nan,                                        # quiet NaN
        _bits(fmt, fmt.exp_max, 1),                           # signalling-pattern NaN
    ]
    sign = 1 << (fmt.width - 1)
    values = [v for v in magnitudes] + [v | sign for v in magnitudes]
    return np.array(values, dtype=fmt.uint_dtype)


def _random_bits(fmt, sign, exponent, fraction):
    return ((sign.astype(np.uint64) << np.uint64(fmt.width - 1))
            | (exponent.astype(np.uint64) << np.uint64(fmt.mant_bits))
            | fraction.astype(np.uint64))


def float_test_vectors(fmt, count, seed):
    """``(a_bits, b_bits)``: every pair of :func:`special_values`, then ``count`` random pairs.

    The random pairs are a mix: 40 % uniformly random bit patterns; 15 % with both exponents
    biased towards the subnormal range; 15 % whose product lands around the subnormal/normal
    boundary; 15 % near-cancellation pairs for the adder (opposite signs, exponents within one,
    often a few ulps apart); 15 % near overflow (products and sums around the largest finite
    number).
    """
    fmt = float_format(fmt)
    count = int(count)
    rng = np.random.default_rng(seed)
    m, bias, top = fmt.mant_bits, fmt.bias, fmt.exp_max - 1

    specials = special_values(fmt)
    special_a = np.repeat(specials, len(specials))
    special_b = np.tile(specials, len(specials))

    def signs(n):
        return rng.integers(0, 2, n)

    def fractions(n):
        return rng.integers(0, 1 << m, n)

    shares = [0.40, 0.15, 0.15, 0.15]
    sizes = [int(count * share) for share in shares]
    sizes.append(count - sum(sizes))
    n_uniform, n_subnormal, n_boundary, n_cancel, n_overflow = sizes
    a_parts, b_parts = [], []

    # Uniformly random bit patterns.
    a_parts.append(rng.integers(0, 1 << fmt.width, n_uniform, dtype=np.uint64))
    b_parts.append(rng.integers(0, 1 << fmt.width, n_uniform, dtype=np.uint64))

    # Exponents biased towards the subnormal range: half subnormal, the rest just above.
    def low_exponents(n):
        return np.where(rng.random(n) < 0.5, 0, rng.integers(1, m + 3, n))
    for parts in (a_parts, b_parts):
        parts.append(_random_bits(fmt, signs(n_subnormal), low_exponents(n_subnormal),
                                  fractions(n_subnormal)))

    # Products around the subnormal/normal boundary: the unbiased exponents sum to
    # emin - (m + 3) .. emin + 1, so every subnormal shift and the carry into 2**emin occur.
    exp_a = rng.integers(1, top + 1, n_boundary)
    target = (1 - bias) + rng.integers(-(m + 3), 2, n_boundary)   # unbiased product exponent
    exp_b = np.clip(target - (exp_a - bias) + bias, 0, top)
    a_parts.append(_random_bits(fmt, signs(n_boundary), exp_a, fractions(n_boundary)))
    b_parts.append(_random_bits(fmt, signs(n_boundary), exp_b, fractions(n_boundary)))

    # Near cancellation: b has the opposite sign and an exponent within one of a's; half of
    # them are a few ulps away from -a (so the difference is tiny, or exactly zero).
    sign_bit = 1 << (fmt.width - 1)
    max_finite = _bits(fmt, top, (1 << m) - 1)
    exp_a = rng.integers(0, top + 1, n_cancel)
    sign_a = signs(n_cancel)
    a_cancel = _random_bits(fmt, sign_a, exp_a, fractions(n_cancel)).astype(np.int64)
    close = np.clip((a_cancel & (sign_bit - 1)) + rng.integers(-3, 4, n_cancel), 0, max_finite)
    exp_b = np.clip(exp_a + rng.integers(-1, 2, n_cancel), 0, top)
    spread = _random_bits(fmt, sign_a, exp_b, fractions(n_cancel)).astype(np.int64)
    b_cancel = (np.where(rng.random(n_cancel) < 0.5, close, spread & (sign_bit - 1))
                | ((a_cancel & sign_bit) ^ sign_bit))
    a_parts.append(a_cancel.astype(np.uint64))
    b_parts.append(b_cancel.astype(np.uint64))

    # Near overflow: products whose unbiased exponents sum to emax - 1 .. emax + 1, and sums
    # of two large numbers of the same sign.
    n_product = n_overflow // 2
    n_sum = n_overflow - n_product
    exp_a = rng.integers(bias, top + 1, n_product)
    target = (top - bias) + rng.integers(-1, 2, n_product)
    exp_b = np.clip(target - (exp_a - bias) + bias, 1, top)
    a_parts.append(_random_bits(fmt, signs(n_product), exp_a, fractions(n_product)))
    b_parts.append(_random_bits(fmt, signs(n_product), exp_b, fractions(n_product)))
    sign = signs(n_sum)
    a_parts.append(_random_bits(fmt, sign, rng.integers(top - 1, top + 1, n_sum),
                                fractions(n_sum)))
    b_parts.append(_random_bits(fmt, sign, rng.integers(top - m - 2, top + 1, n_sum),
                                fractions(n_sum)))

    a_random = np.concatenate(a_parts).astype(fmt.uint_dtype)
    b_random = np.concatenate(b_parts).astype(fmt.uint_dtype)
    order = rng.permutation(count)
    return (np.concatenate([special_a, a_random[order]]),
            np.concatenate([special_b, b_random[order]]))


def reference_mul(a_bits, b_bits, fmt):
    """The bits of ``a * b`` computed by NumPy in ``fmt``'s dtype."""
    fmt = float_format(fmt)
    with np.errstate(all="ignore"):
        return to_bits(from_bits(a_bits, fmt) * from_bits(b_bits, fmt), fmt)


def reference_add(a_bits, b_bits, fmt):
    """The bits of ``a + b`` computed by NumPy in ``fmt``'s dtype."""
    fmt = float_format(fmt)
    with np.errstate(all="ignore"):
        return to_bits(from_bits(a_bits, fmt) + from_bits(b_bits, fmt), fmt)


# Amaranth-simulator drivers shared by the multiplier and adder tests. Both feed operand pairs
# and collect results in order; the checks against the references are left to the caller.

def _simulator(unit):
    from amaranth.hdl import ClockDomain, Module
    from amaranth.sim import Simulator

    # A combinational unit has no clock domain of its own; the testbench still counts cycles.
    top = Module()
    top.domains.sync = ClockDomain()
    top.submodules.unit = unit
    sim = Simulator(top)
    sim.add_clock(1e-6)
    return sim


def simulate_core(core, a_bits, b_bits, *, output, enable_probability=1.0, seed=0):
    """Run a ``latency``-stage core (ports ``a``, ``b``, ``en`` and ``output``) on the pairs.

    One pair is presented per cycle and ``en`` is high with ``enable_probability``; a pair
    enters the pipeline on an enabled cycle and its result is read on the enabled cycle that
    moves it out of the last stage (so results held through disabled cycles are checked at the
    end of the hold). Returns the results in input order.
    """
    a_bits, b_bits = [int(x) for x in a_bits], [int(x) for x in b_bits]
    count, latency = len(a_bits), core.latency
    rng = np.random.default_rng(seed)
    results = []

    async def testbench(ctx):
        stages = [None] * latency              # which pair each register stage holds
        index = 0
        while len(results) < count:
            enable = bool(rng.random() < enable_probability)
            if index < count:
                ctx.set(core.a, a_bits[index])
                ctx.set(core.b, b_bits[index])
            ctx.set(core.en, enable)
            if latency == 0:
                results.append(ctx.get(getattr(core, output)))
                index += 1
            elif enable:
                if stages[-1] is not None:
                    assert stages[-1] == len(results)
                    results.append(ctx.get(getattr(core, output)))
                stages = [index if index < count else None] + stages[:-1]
                index = min(index + 1, count)
            await ctx.tick()

    sim = _simulator(core)
    sim.add_testbench(testbench)
    sim.run()
    return np.array(results, dtype=np.uint64)


def simulate_stream(unit, a_bits, b_bits, *, output, valid_probability=1.0,
                    ready_probability=1.0, seed=0):
    """Stream the pairs through ``unit`` (``i`` with fields a, b; ``o`` with field ``output``).

    The producer holds each pair for a random number of idle cycles (valid low) before
    offering it and keeps it offered until taken; the consumer drives ``o.ready`` high with
    ``ready_probability``. In every cycle the consumer also checks that ``o.valid`` does not
    depend on ``o.ready``; after the last result it checks that nothing more comes out.
    Returns ``(results, cycles)``: the results in arrival order and the cycle (clock edge
    number, from 0) at which each was taken.
    """
    a_bits, b_bits = [int(x) for x in a_bits], [int(x) for x in b_bits]
    count = len(a_bits)
    in_rng = np.random.default_rng([seed, 0])
    out_rng = np.random.default_rng([seed, 1])
    results, cycles = [], []
    field = unit.o.payload[output]
    cycle_limit = 20 * (count + unit.latency + 10)

    async def producer(ctx):
        for a, b in zip(a_bits, b_bits):
            while in_rng.random() >= valid_probability:
                await ctx.tick()
            ctx.set(unit.i.payload.a, a)
            ctx.set(unit.i.payload.b, b)
            ctx.set(unit.i.valid, 1)
            await ctx.tick().until(unit.i.ready)
            ctx.set(unit.i.valid, 0)

    async def consumer(ctx):
        cycle = 0
        drain = unit.latency + 4               # cycles watched after the last result
        while len(results) < count or drain:
            assert cycle < cycle_limit, f"only {len(results)} of {count} results came out"
            ready = len(results) >= count or bool(out_rng.random() < ready_probability)
            ctx.set(unit.o.ready, not ready)
            valid_other = ctx.get(unit.o.valid)
            ctx.set(unit.o.ready, ready)
            assert ctx.get(unit.o.valid) == valid_other, \
                f"o.valid depends on o.ready at cycle {cycle}"
            _, _, valid, value = await ctx.tick().sample(unit.o.valid, field)
            if len(results) >= count:
                assert not valid, f"an extra result came out at cycle {cycle}"
                drain -= 1
            elif valid and ready:
                results.append(value)
                cycles.append(cycle)
            cycle += 1

    sim = _simulator(unit)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return np.array(results, dtype=np.uint64), cycles


_VERILOG_BENCH = """
module bench;
    reg clk = 0, rst = 1, en = 0;
    reg [{msb}:0] a = 0, b = 0;
    wire [{msb}:0] result;
    reg [{msb}:0] va [0:{last}];
    reg [{msb}:0] vb [0:{last}];
    reg ve [0:{cycles_last}];
    integer f, i, c, taken;
    core dut(.clk(clk), .rst(rst), .en(en), .a(a), .b(b), .{output}(result));
    always #5 clk = ~clk;
    initial begin
        $readmemh("a.hex", va); $readmemh("b.hex", vb); $readmemh("en.hex", ve);
        f = $fopen("result.hex", "w");
        repeat (2) @(posedge clk);
        @(negedge clk) rst = 0;
        i = 0; taken = 0;
        for (c = 0; taken < {count}; c = c + 1) begin
            a = va[i]; b = vb[i]; en = ve[c];
            #4;     // just before the rising edge: the result for the operands presented
                    // latency enabled edges ago
            if (en) begin
                if (i >= {latency}) begin $fwrite(f, "%h\\n", result); taken = taken + 1; end
                i = i + 1;
            end
            @(negedge clk);
        end
        $fclose(f);
        $finish;
    end
endmodule
"""


def simulate_core_verilog(core, a_bits, b_bits, *, output, enable_probability=1.0, seed=0,
                          sources=()):
    """:func:`simulate_core` on the core's emitted Verilog, in Icarus Verilog.

    ``sources`` are more Verilog texts to compile with it (for example the simulation model
    of a vendor cell the core instantiates). Needs ``iverilog`` and ``vvp`` on the path.
    """
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    from amaranth.back import verilog

    iverilog, vvp = shutil.which("iverilog"), shutil.which("vvp")
    if iverilog is None or vvp is None:
        raise FileNotFoundError(_icarus_missing())
    fmt = core.format
    a_bits = np.asarray(a_bits, dtype=np.uint64)
    b_bits = np.asarray(b_bits, dtype=np.uint64)
    count, latency, digits = len(a_bits), core.latency, fmt.width // 4
    rng = np.random.default_rng(seed)
    enables = (rng.random(int((count + latency) / max(enable_probability, 0.1)) * 2 + 16)
               < enable_probability).astype(int)
    enables[-(count + latency + 8):] = 1         # enough enabled cycles to drain
    pad = np.zeros(latency + 1, dtype=np.uint64)
    with tempfile.TemporaryDirectory(prefix="moe_hw_core_") as tmp:
        tmp = Path(tmp)
        for name, values in (("a", np.concatenate([a_bits, pad])),
                             ("b", np.concatenate([b_bits, pad]))):
            (tmp / f"{name}.hex").write_text(
                "".join(f"{int(v):0{digits}x}\n" for v in values))
        (tmp / "en.hex").write_text("".join(f"{v}\n" for v in enables))
        files = ["bench.v", "core.v"]
        (tmp / "core.v").write_text(verilog.convert(core, name="core"))
        for index, text in enumerate(sources):
            files.append(f"source{index}.v")
            (tmp / files[-1]).write_text(text)
        (tmp / "bench.v").write_text(_VERILOG_BENCH.format(
            msb=fmt.width - 1, last=count + latency, cycles_last=len(enables) - 1,
            count=count, latency=latency, output=output))
        subprocess.run([iverilog, "-g2012", "-o", "bench.vvp", *files], cwd=tmp, check=True,
                       capture_output=True)
        subprocess.run([vvp, "-n", "bench.vvp"], cwd=tmp, check=True, capture_output=True)
        text = (tmp / "result.hex").read_text()
    return np.array([int(line, 16) for line in text.split()], dtype=np.uint64)


def _icarus_missing():
    """Why :func:`simulate_core_verilog` cannot run here, or ``None``."""
    import shutil
    if shutil.which("iverilog") is None or shutil.which("vvp") is None:
        return "Icarus Verilog (iverilog, vvp) is not installed (apt-get install iverilog)"
    return None


simulate_core_verilog.unavailable = _icarus_missing
