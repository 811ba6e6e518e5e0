"""Explicit ECP5 DSP instances for the float multiplier: ``MULT18X18D`` with its registers on.

``synth_ecp5`` maps a plain ``*`` onto MULT18X18D but leaves the block's input and output
registers unused (and does not move fabric registers into them): a combinational
MULT18X18D limits a design to about 177 MHz on LFE5U-85F speed 8. With the input and
output registers on, the multiplier itself is no longer the critical path.

Simulation: Yosys ships only a black box for MULT18X18D; :data:`MULT18X18D_SIM` is a
behavioural model of the subset used here (unsigned 18x18, CLK0/CE0 registers, no reset) for
Verilator and Icarus.
"""

from amaranth.hdl import ClockSignal, Const, Instance, Signal

__all__ = ["mult18x18d", "MULT18X18D_SIM"]


def mult18x18d(m, a, b, *, en, reg_inputs, reg_outputs, name):
    """An unsigned ``a * b`` (each at most 18 bits) on one MULT18X18D, returning 36 bits.

    ``reg_inputs`` and ``reg_outputs`` turn the block's input (A and B) and output registers
    on; they load when ``en`` is high (CE0), like every other register of the pipeline.
    """
    assert len(a) <= 18 and len(b) <= 18
    product = Signal(36, name=name)
    reg = lambda on: "CLK0" if on else "NONE"   # noqa: E731
    ports = {}
    for i in range(18):
        ports[f"i_A{i}"] = a[i] if i < len(a) else Const(0)
        ports[f"i_B{i}"] = b[i] if i < len(b) else Const(0)
        ports[f"i_C{i}"] = Const(0)
    for i in range(36):
        ports[f"o_P{i}"] = product[i]
    for i in range(4):
        ports[f"i_CLK{i}"] = ClockSignal() if i == 0 else Const(0)
        ports[f"i_CE{i}"] = en if i == 0 else Const(0)
        ports[f"i_RST{i}"] = Const(0)
    m.submodules[name] = Instance(
        "MULT18X18D",
        p_REG_INPUTA_CLK=reg(reg_inputs), p_REG_INPUTA_CE="CE0", p_REG_INPUTA_RST="RST0",
        p_REG_INPUTB_CLK=reg(reg_inputs), p_REG_INPUTB_CE="CE0", p_REG_INPUTB_RST="RST0",
        p_REG_INPUTC_CLK="NONE",
        p_REG_PIPELINE_CLK="NONE",
        p_REG_OUTPUT_CLK=reg(reg_outputs), p_REG_OUTPUT_CE="CE0", p_REG_OUTPUT_RST="RST0",
        p_GSR="DISABLED", p_RESETMODE="SYNC", p_SOURCEB_MODE="B_SHIFT",
        p_MULT_BYPASS="DISABLED", p_CAS_MATCH_REG="FALSE",
        i_SIGNEDA=Const(0), i_SIGNEDB=Const(0), i_SOURCEA=Const(0), i_SOURCEB=Const(0),
        **ports)
    return product


def _sim_model():
    a = ", ".join(f"A{i}" for i in range(18))
    b = ", ".join(f"B{i}" for i in range(18))
    c = ", ".join(f"C{i}" for i in range(18))
    p = ", ".join(f"P{i}" for i in range(36))
    pa = ", ".join(f"A{i}" for i in reversed(range(18)))
    pb = ", ".join(f"B{i}" for i in reversed(range(18)))
    assigns = "\n".join(f"    assign P{i} = p[{i}];" for i in range(36))
    return f"""// Behavioural model of the ECP5 MULT18X18D subset used by moe_hw (unsigned, CLK0/CE0
// input and output registers, no reset, no pipeline register, no cascade).
module MULT18X18D({a}, {b}, {c}, SIGNEDA, SIGNEDB, SOURCEA, SOURCEB,
    CLK3, CLK2, CLK1, CLK0, CE3, CE2, CE1, CE0, RST3, RST2, RST1, RST0, {p});
    parameter REG_INPUTA_CLK = "NONE";
    parameter REG_INPUTA_CE = "CE0";
    parameter REG_INPUTA_RST = "RST0";
    parameter REG_INPUTB_CLK = "NONE";
    parameter REG_INPUTB_CE = "CE0";
    parameter REG_INPUTB_RST = "RST0";
    parameter REG_INPUTC_CLK = "NONE";
    parameter REG_PIPELINE_CLK = "NONE";
    parameter REG_OUTPUT_CLK = "NONE";
    parameter REG_OUTPUT_CE = "CE0";
    parameter REG_OUTPUT_RST = "RST0";
    parameter GSR = "DISABLED";
    parameter RESETMODE = "SYNC";
    parameter SOURCEB_MODE = "B_SHIFT";
    parameter MULT_BYPASS = "DISABLED";
    parameter CAS_MATCH_REG = "FALSE";
    input {a}, {b}, {c}, SIGNEDA, SIGNEDB, SOURCEA, SOURCEB;
    input CLK3, CLK2, CLK1, CLK0, CE3, CE2, CE1, CE0, RST3, RST2, RST1, RST0;
    output {p};
    wire [17:0] a_in = {{{pa}}};
    wire [17:0] b_in = {{{pb}}};
    reg [17:0] a_reg = 18'd0, b_reg = 18'd0;
    reg [35:0] p_reg = 36'd0;
    always @(posedge CLK0) if (CE0) begin a_reg <= a_in; b_reg <= b_in; end
    wire [17:0] a_use = (REG_INPUTA_CLK == "CLK0") ? a_reg : a_in;
    wire [17:0] b_use = (REG_INPUTB_CLK == "CLK0") ? b_reg : b_in;
    wire [35:0] p_comb = a_use * b_use;
    always @(posedge CLK0) if (CE0) p_reg <= p_comb;
    wire [35:0] p = (REG_OUTPUT_CLK == "CLK0") ? p_reg : p_comb;
{assigns}
endmodule
"""


#: Verilog text of the simulation model (add it to the sources of a Verilator/Icarus build).
MULT18X18D_SIM = _sim_model()
