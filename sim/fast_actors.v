// The fast path's actors: the cocotb harness's StreamSource, StreamSink, MemoryReader and
// MemoryWriter (sim/harness.py) written once in Verilog, so that a whole problem runs inside
// the simulator. moe_hw/flows/fastsim.py generates the testbench that instantiates them.
//
// Every actor mirrors its Python twin cycle for cycle: at each rising edge where ``step`` is
// high it first takes the handshake of the cycle before the edge (the values the non-blocking
// semantics give it), then drives its registered outputs for the next cycle. Without pauses
// (threshold 0) a run therefore takes exactly the cocotb bench's cycle count. Pauses come from
// one xorshift32 per port (seed and threshold are run-time inputs), not from Python's
// generator, so stalled runs differ from the cocotb path's stalled runs in timing only.
//
// Inputs are read as binary words (FAST_LOAD: several times faster to load than hex text);
// logs are written raw (FAST_DUMP). Run-time files and counts come from plusargs named after
// the actor (NAME):
//   +NAME=FILE +NAME_count=N     a source's words ($fread: each word big-endian, in whole
//                                bytes)
//   +NAME_out=FILE               a sink's log of every beat taken (written at the end)
//   +NAME_size=N +NAME=FILE      a memory's elements (reader: loaded as a source's words;
//                                writer: zeroed)
//   +NAME_memory=FILE            a writer's memory image at the end
//   +NAME_max_writes=N           the most writes a writer's element may take (0: any number)
//   +NAME_addr=FILE +NAME_enable=FILE    a reader's log of requests
// Each prints ``FASTSIM NAME.key=value`` lines at the end for the host to read.

// The room check and the loader every actor that starts with words in memory shares (the
// source's words, a memory reader's elements). Both stop the run with a ``FASTSIM error``
// line naming the actor (NAME, WHAT: "source" or "memory"; NOUN: what its words are).
// ROOM: the array's depth; LOAD: COUNT words of BYTES bytes into ARRAY from +NAME=FILE
// (each word big-endian, in whole bytes, as $fread reads them). DUMP: the first COUNT words (W
// bits each) of ARRAY into +NAME<KEY>=FILE, raw (as $fwrite "%u" writes them: each word in
// 32-bit pieces, least significant first, each little-endian; several times faster to write
// and to read back than $writememh's hex). Icarus Verilog runs $fread and $fwrite; the C++
// model (whose $fread takes a locked fgetc per byte and whose $fwrite builds a string a byte
// at a time) calls sim/fast_io.h instead, which moves the same bytes with one fread or a
// buffered fwrite per array (FAST_READ, FAST_WRITE). (No comment line may start with that
// simulator's name: it reads such a line as a pragma.) The module declares ``file``, ``fd``,
// ``dump``.
`ifdef VERILATOR
`define FAST_READ(ARRAY, COUNT, BYTES) $c64("fast_load(", fd, ", ", ARRAY, ", ", COUNT, ", ", BYTES, ")")
`define FAST_WRITE(ARRAY, COUNT, W) $c("fast_dump(", fd, ", ", ARRAY, ", ", COUNT, ", ", W, ");");
`else
`define FAST_READ(ARRAY, COUNT, BYTES) $fread(ARRAY, fd, 0, COUNT)
`define FAST_WRITE(ARRAY, COUNT, W) \
    for (dump = 0; dump < (COUNT); dump = dump + 1) $fwrite(fd, "%u", ARRAY[dump]);
`endif
`define FAST_ROOM(WHAT, NOUN, COUNT, ROOM) \
    if ((COUNT) > (ROOM)) begin \
        $display("FASTSIM error: %0s %0s has %0d %0s, room for %0d", WHAT, NAME, COUNT, \
                 NOUN, ROOM); \
        $finish; \
    end
`define FAST_LOAD(WHAT, NOUN, ARRAY, COUNT, BYTES) \
    if ((COUNT) > 0) begin \
        if (!$value$plusargs({NAME, "=%s"}, file)) begin \
            $display("FASTSIM error: %0s %0s has no +%0s=FILE", WHAT, NAME, NAME); \
            $finish; \
        end \
        fd = $fopen(file, "rb"); \
        if (fd == 0 || `FAST_READ(ARRAY, COUNT, BYTES) != (COUNT) * (BYTES)) begin \
            $display("FASTSIM error: %0s %0s cannot read %0d %0s from %0s", WHAT, NAME, \
                     COUNT, NOUN, file); \
            $finish; \
        end \
        $fclose(fd); \
    end

`define FAST_DUMP(KEY, ARRAY, COUNT, W) \
    if ((COUNT) > 0 && $value$plusargs({NAME, KEY, "=%s"}, file)) begin \
        fd = $fopen(file, "wb"); \
        `FAST_WRITE(ARRAY, COUNT, W) \
        $fclose(fd); \
    end

// Seeded random pauses: ``pause`` is high with probability threshold / 65536 per step.
module fast_pauses #(parameter [31:0] SALT = 0) (
    input clk, input rst, input step, input [31:0] seed, input [15:0] threshold,
    output pause
);
    reg [31:0] state = 32'h1;
    wire [31:0] s1 = state ^ (state << 13);
    wire [31:0] s2 = s1 ^ (s1 >> 17);
    wire [31:0] next = s2 ^ (s2 << 5);
    wire [31:0] init = (seed * 32'h9E3779B1) ^ (SALT * 32'h85EBCA6B) ^ 32'h6A09E667;
    assign pause = state[31:16] < threshold;
    always @(posedge clk)
        if (rst) state <= (init == 32'h0) ? 32'h1 : init;
        else if (step) state <= next;
endmodule

// StreamSource: offers its words in order on valid/payload, pausing at random.
module fast_source #(
    parameter NAME = "source", parameter W = 1, parameter MEM_W = 8, parameter DEPTH = 1,
    parameter [31:0] SALT = 0
) (
    input clk, input rst, input step, input [31:0] seed, input [15:0] threshold,
    output reg valid = 1'b0, input ready, output reg [W-1:0] payload = {W{1'b0}},
    output reg [63:0] sent = 64'd0
);
    reg [MEM_W-1:0] words [0:DEPTH-1];
    reg [63:0] count = 64'd0;
    reg [8*1024-1:0] file;
    integer fd;
    reg v;
    reg [63:0] s;
    wire pause;
    fast_pauses #(SALT) pauses(clk, rst, step, seed, threshold, pause);
    initial begin
        if (!$value$plusargs({NAME, "_count=%d"}, count)) count = 64'd0;
        `FAST_ROOM("source", "words", count, DEPTH)
        `FAST_LOAD("source", "words", words, count, MEM_W / 8)
    end
    always @(posedge clk)
        if (rst) begin
            valid <= 1'b0;
            sent <= 64'd0;
        end else if (step) begin
            v = valid;
            s = sent;
            if (v && ready) begin
                s = s + 1;
                v = 1'b0;
            end
            if (!v && s < count && !pause) begin
                payload <= words[s][W-1:0];
                v = 1'b1;
            end
            valid <= v;
            sent <= s;
        end
    final $display("FASTSIM %0s.sent=%0d %0s.words=%0d", NAME, sent, NAME, count);
endmodule

// StreamSink: takes every beat (ready paused at random) into a log of DEPTH beats.
module fast_sink #(
    parameter NAME = "sink", parameter W = 1, parameter DEPTH = 1, parameter [31:0] SALT = 0
) (
    input clk, input rst, input step, input [31:0] seed, input [15:0] threshold,
    input valid, output reg ready = 1'b0, input [W-1:0] payload,
    output reg [63:0] count = 64'd0
);
    reg [W-1:0] log [0:DEPTH-1];
    reg [8*1024-1:0] file;
    reg [63:0] dump;
    integer fd;
    wire pause;
    fast_pauses #(SALT) pauses(clk, rst, step, seed, threshold, pause);
    always @(posedge clk)
        if (rst) begin
            ready <= 1'b0;
            count <= 64'd0;
        end else if (step) begin
            if (ready && valid) begin
                if (count < DEPTH) log[count] <= payload;
                count <= count + 1;
            end
            ready <= !pause;
        end
    final begin
        $display("FASTSIM %0s.count=%0d %0s.depth=%0d", NAME, count, NAME, DEPTH);
        if (count <= DEPTH) `FAST_DUMP("_out", log, count, W)
    end
endmodule

// MemoryWriter: a sink whose beats (fields addr, data, enable) also write lanes into a memory
// of NAME_size elements; lanes outside it are not written and are counted. The scoreboard's
// writes per address: every element counts the writes it takes (saturating at 255); a write
// past NAME_max_writes (0: no limit) is counted in ``rewrites``, the first one's element and
// simulation time kept. Also reported: the elements written and the most writes to one.
// IMAGE 0: the elements' values are not kept (nobody reads them; the log has the writes).
module fast_memory_writer #(
    parameter NAME = "writer", parameter W = 1, parameter DEPTH = 1, parameter SIZE = 1,
    parameter ELEM_W = 1, parameter LANES = 1, parameter ADDR_OFF = 0, parameter ADDR_W = 1,
    parameter DATA_OFF = 0, parameter EN_OFF = 0, parameter IMAGE = 1,
    parameter [31:0] SALT = 0
) (
    input clk, input rst, input step, input [31:0] seed, input [15:0] threshold,
    input valid, output ready, input [W-1:0] payload, output [63:0] count
);
    reg [ELEM_W-1:0] memory [0:(IMAGE ? SIZE : 1)-1];
    reg [7:0] writes [0:SIZE-1];
    reg [63:0] size = 64'd0, out_of_bounds = 64'd0, bad, where;
    reg [63:0] max_writes = 64'd0, rewrites = 64'd0, first_rewrite = 64'd0;
    reg [63:0] first_rewrite_time = 64'd0, written = 64'd0, most = 64'd0;
    reg [7:0] taken;
    reg [8*1024-1:0] file;
    reg [63:0] dump;
    integer lane, fd;
    fast_sink #(.NAME(NAME), .W(W), .DEPTH(DEPTH), .SALT(SALT)) log(
        clk, rst, step, seed, threshold, valid, ready, payload, count);
    initial begin
        if (!$value$plusargs({NAME, "_size=%d"}, size)) size = 64'd0;
        if (!$value$plusargs({NAME, "_max_writes=%d"}, max_writes)) max_writes = 64'd0;
        `FAST_ROOM("memory", "elements", size, SIZE)
        for (where = 0; where < size; where = where + 1) begin
            if (IMAGE) memory[where] = {ELEM_W{1'b0}};
            writes[where] = 8'd0;
        end
    end
    always @(posedge clk)
        if (rst) out_of_bounds <= 64'd0;
        else if (step && ready && valid) begin
            bad = out_of_bounds;
            for (lane = 0; lane < LANES; lane = lane + 1)
                if (payload[EN_OFF + lane]) begin
                    where = payload[ADDR_OFF +: ADDR_W] + lane;
                    if (where < size) begin
                        if (IMAGE) memory[where] <= payload[DATA_OFF + lane * ELEM_W +: ELEM_W];
                        taken = writes[where];
                        if (taken != 8'hff) writes[where] = taken + 8'd1;
                        if (taken == 8'd0) written = written + 1;
                        if (taken != 8'hff && {56'd0, taken} >= most) most = {56'd0, taken} + 1;
                        if (max_writes != 0 && {56'd0, taken} >= max_writes) begin
                            if (rewrites == 0) begin
                                first_rewrite = where;
                                first_rewrite_time = $time;
                            end
                            rewrites = rewrites + 1;
                        end
                    end else bad = bad + 1;
                end
            out_of_bounds <= bad;
        end
    final begin
        $display("FASTSIM %0s.out_of_bounds=%0d %0s.written=%0d %0s.most_writes=%0d",
                 NAME, out_of_bounds, NAME, written, NAME, most);
        $display("FASTSIM %0s.max_writes=%0d %0s.rewrites=%0d %0s.first_rewrite=%0d %0s.first_rewrite_time=%0d",
                 NAME, max_writes, NAME, rewrites, NAME, first_rewrite, NAME, first_rewrite_time);
        if (IMAGE) `FAST_DUMP("_memory", memory, size, ELEM_W)
    end
endmodule

// MemoryReader: takes requests (fields addr and, if HAS_EN, enable) and answers each in order
// on the response stream (field data) LATENCY cycles after it was taken, or later when paused.
// The memory is read when the request is taken; lanes outside it read 0 and are counted.
// SHARED: the memory is a writer's (one array behind a read and a write port), whose lanes
// at the request's address the testbench presents on ``shared_word``; it is read before
// that edge's write (the cocotb benches step the reader before the writer).
module fast_memory_reader #(
    parameter NAME = "reader", parameter REQ_W = 1, parameter RESP_W = 1, parameter SIZE = 1,
    parameter ELEM_W = 1, parameter MEM_W = 8, parameter LANES = 1, parameter ADDR_OFF = 0,
    parameter ADDR_W = 1, parameter HAS_EN = 0, parameter EN_OFF = 0, parameter DATA_OFF = 0,
    parameter LOG_DEPTH = 1, parameter QUEUE = 256, parameter SHARED = 0,
    parameter [31:0] SALT = 0
) (
    input clk, input rst, input step, input [31:0] seed, input [15:0] threshold,
    input req_valid, output reg req_ready = 1'b0, input [REQ_W-1:0] req_payload,
    output reg resp_valid = 1'b0, input resp_ready,
    output reg [RESP_W-1:0] resp_payload = {RESP_W{1'b0}},
    output reg [63:0] requests = 64'd0, input [LANES*ELEM_W-1:0] shared_word
);
    reg [MEM_W-1:0] memory [0:SIZE-1];
    reg [LANES*ELEM_W-1:0] queue_data [0:QUEUE-1];
    reg [63:0] queue_due [0:QUEUE-1];
    reg [63:0] log_addr [0:LOG_DEPTH-1];
    reg [LANES-1:0] log_enable [0:LOG_DEPTH-1];
    reg [63:0] size = 64'd0, latency = 64'd0, cycle = 64'd0, head = 64'd0, tail = 64'd0;
    reg [63:0] out_of_bounds = 64'd0, overflow = 64'd0, addr, where, n;
    reg [LANES-1:0] enable;
    reg [LANES*ELEM_W-1:0] word;
    reg [RESP_W-1:0] response;
    reg [8*1024-1:0] file;
    reg [63:0] dump;
    reg v;
    integer lane, fd;
    wire request_pause, response_pause;
    fast_pauses #(2 * SALT) request_pauses(clk, rst, step, seed, threshold, request_pause);
    fast_pauses #(2 * SALT + 1) response_pauses(clk, rst, step, seed, threshold, response_pause);
    initial begin
        if (!$value$plusargs({NAME, "_size=%d"}, size)) size = 64'd0;
        if (!$value$plusargs({NAME, "_latency=%d"}, latency)) latency = 64'd0;
        if (!SHARED) begin
            `FAST_ROOM("memory", "elements", size, SIZE)
            `FAST_LOAD("memory", "elements", memory, size, MEM_W / 8)
        end
    end
    always @(posedge clk)
        if (rst) begin
            req_ready <= 1'b0;
            resp_valid <= 1'b0;
            cycle <= 64'd0;
        end else if (step) begin
            v = resp_valid;
            if (v && resp_ready) begin
                head = head + 1;
                v = 1'b0;
            end
            if (req_ready && req_valid) begin
                addr = req_payload[ADDR_OFF +: ADDR_W];
                enable = HAS_EN ? req_payload[EN_OFF +: LANES] : {LANES{1'b1}};
                word = {LANES * ELEM_W{1'b0}};
                for (lane = 0; lane < LANES; lane = lane + 1)
                    if (enable[lane]) begin
                        where = addr + lane;
                        if (where < size)
                            word[lane * ELEM_W +: ELEM_W] = SHARED ?
                                shared_word[lane * ELEM_W +: ELEM_W] : memory[where][ELEM_W-1:0];
                        else out_of_bounds = out_of_bounds + 1;
                    end
                if (tail - head >= QUEUE) overflow = overflow + 1;
                queue_data[tail % QUEUE] = word;
                queue_due[tail % QUEUE] = cycle + latency;
                tail = tail + 1;
                if (requests < LOG_DEPTH) begin
                    log_addr[requests] = addr;
                    log_enable[requests] = enable;
                end
                requests <= requests + 1;
            end
            if (!v && tail != head && queue_due[head % QUEUE] <= cycle + 1 && !response_pause) begin
                response = {RESP_W{1'b0}};
                response[DATA_OFF +: LANES * ELEM_W] = queue_data[head % QUEUE];
                resp_payload <= response;
                v = 1'b1;
            end
            cycle <= cycle + 1;
            resp_valid <= v;
            req_ready <= !request_pause;
        end
    final begin
        n = requests;
        $display("FASTSIM %0s.requests=%0d %0s.log_depth=%0d %0s.out_of_bounds=%0d %0s.queue_overflow=%0d %0s.pending=%0d",
                 NAME, n, NAME, LOG_DEPTH, NAME, out_of_bounds, NAME, overflow, NAME, tail - head);
        if (n <= LOG_DEPTH) begin
            `FAST_DUMP("_addr", log_addr, n, 64)
            `FAST_DUMP("_enable", log_enable, n, LANES)
        end
    end
endmodule

// A status monitor: logs (cycle, value) whenever ``value`` changes (the cocotb benches'
// PhaseMonitor), ``cycle`` counted from the start edge.
module fast_monitor #(parameter NAME = "monitor", parameter W = 1, parameter DEPTH = 1) (
    input clk, input rst, input step, input [W-1:0] value, input [63:0] cycle
);
    reg [W-1:0] last = {W{1'b0}};
    reg [63:0] count = 64'd0;
    reg [63:0] log_cycle [0:DEPTH-1];
    reg [63:0] log_value [0:DEPTH-1];
    reg [8*1024-1:0] file;
    reg [63:0] dump;
    integer fd;
    always @(posedge clk)
        if (rst) begin
            last <= {W{1'b0}};
            count <= 64'd0;
        end else if (step && value != last) begin
            if (count < DEPTH) begin
                log_cycle[count] <= cycle;
                log_value[count] <= value;
            end
            count <= count + 1;
            last <= value;
        end
    final begin
        $display("FASTSIM %0s.changes=%0d %0s.depth=%0d", NAME, count, NAME, DEPTH);
        if (count <= DEPTH) begin
            `FAST_DUMP("_cycle", log_cycle, count, 64)
            `FAST_DUMP("_value", log_value, count, 64)
        end
    end
endmodule
