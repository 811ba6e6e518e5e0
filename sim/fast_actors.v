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
// Inputs are read with $fread (binary words: several times faster to load than hex text);
// logs are written with $writememh. Run-time files and counts come from plusargs named after
// the actor (NAME):
//   +NAME=FILE +NAME_count=N     a source's words ($fread: each word big-endian, in whole
//                                bytes)
//   +NAME_out=FILE               a sink's log of every beat taken ($writememh at the end)
//   +NAME_size=N +NAME=FILE      a memory's elements (reader: loaded as a source's words;
//                                writer: zeroed)
//   +NAME_memory=FILE            a writer's memory image at the end
//   +NAME_addr=FILE +NAME_enable=FILE    a reader's log of requests
// Each prints ``FASTSIM NAME.key=value`` lines at the end for the host to read.

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
        if (count > DEPTH) begin
            $display("FASTSIM error: source %0s has %0d words, room for %0d", NAME, count, DEPTH);
            $finish;
        end
        if (count > 0) begin
            if (!$value$plusargs({NAME, "=%s"}, file)) begin
                $display("FASTSIM error: source %0s has no +%0s=FILE", NAME, NAME);
                $finish;
            end
            fd = $fopen(file, "rb");
            if (fd == 0 || $fread(words, fd, 0, count) != count * (MEM_W / 8)) begin
                $display("FASTSIM error: source %0s cannot read %0d words from %0s", NAME,
                         count, file);
                $finish;
            end
            $fclose(fd);
        end
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
        if (count > 0 && count <= DEPTH && $value$plusargs({NAME, "_out=%s"}, file))
            $writememh(file, log, 0, count - 1);
    end
endmodule

// MemoryWriter: a sink whose beats (fields addr, data, enable) also write lanes into a memory
// of NAME_size elements; lanes outside it are not written and are counted.
module fast_memory_writer #(
    parameter NAME = "writer", parameter W = 1, parameter DEPTH = 1, parameter SIZE = 1,
    parameter ELEM_W = 1, parameter LANES = 1, parameter ADDR_OFF = 0, parameter ADDR_W = 1,
    parameter DATA_OFF = 0, parameter EN_OFF = 0, parameter [31:0] SALT = 0
) (
    input clk, input rst, input step, input [31:0] seed, input [15:0] threshold,
    input valid, output ready, input [W-1:0] payload, output [63:0] count
);
    reg [ELEM_W-1:0] memory [0:SIZE-1];
    reg [63:0] size = 64'd0, out_of_bounds = 64'd0, bad, where;
    reg [8*1024-1:0] file;
    integer lane;
    fast_sink #(.NAME(NAME), .W(W), .DEPTH(DEPTH), .SALT(SALT)) log(
        clk, rst, step, seed, threshold, valid, ready, payload, count);
    initial begin
        if (!$value$plusargs({NAME, "_size=%d"}, size)) size = 64'd0;
        if (size > SIZE) begin
            $display("FASTSIM error: memory %0s has %0d elements, room for %0d", NAME, size, SIZE);
            $finish;
        end
        for (where = 0; where < size; where = where + 1) memory[where] = {ELEM_W{1'b0}};
    end
    always @(posedge clk)
        if (rst) out_of_bounds <= 64'd0;
        else if (step && ready && valid) begin
            bad = out_of_bounds;
            for (lane = 0; lane < LANES; lane = lane + 1)
                if (payload[EN_OFF + lane]) begin
                    where = payload[ADDR_OFF +: ADDR_W] + lane;
                    if (where < size) memory[where] <= payload[DATA_OFF + lane * ELEM_W +: ELEM_W];
                    else bad = bad + 1;
                end
            out_of_bounds <= bad;
        end
    final begin
        $display("FASTSIM %0s.out_of_bounds=%0d", NAME, out_of_bounds);
        if (size > 0 && $value$plusargs({NAME, "_memory=%s"}, file))
            $writememh(file, memory, 0, size - 1);
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
    reg v;
    integer lane, fd;
    wire request_pause, response_pause;
    fast_pauses #(2 * SALT) request_pauses(clk, rst, step, seed, threshold, request_pause);
    fast_pauses #(2 * SALT + 1) response_pauses(clk, rst, step, seed, threshold, response_pause);
    initial begin
        if (!$value$plusargs({NAME, "_size=%d"}, size)) size = 64'd0;
        if (!$value$plusargs({NAME, "_latency=%d"}, latency)) latency = 64'd0;
        if (size > SIZE && !SHARED) begin
            $display("FASTSIM error: memory %0s has %0d elements, room for %0d", NAME, size, SIZE);
            $finish;
        end
        if (size > 0 && !SHARED) begin
            if (!$value$plusargs({NAME, "=%s"}, file)) begin
                $display("FASTSIM error: memory %0s has no +%0s=FILE", NAME, NAME);
                $finish;
            end
            fd = $fopen(file, "rb");
            if (fd == 0 || $fread(memory, fd, 0, size) != size * (MEM_W / 8)) begin
                $display("FASTSIM error: memory %0s cannot read %0d elements from %0s", NAME,
                         size, file);
                $finish;
            end
            $fclose(fd);
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
        if (n > 0 && n <= LOG_DEPTH) begin
            if ($value$plusargs({NAME, "_addr=%s"}, file)) $writememh(file, log_addr, 0, n - 1);
            if ($value$plusargs({NAME, "_enable=%s"}, file)) $writememh(file, log_enable, 0, n - 1);
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
        if (count > 0 && count <= DEPTH) begin
            if ($value$plusargs({NAME, "_cycle=%s"}, file)) $writememh(file, log_cycle, 0, count - 1);
            if ($value$plusargs({NAME, "_value=%s"}, file)) $writememh(file, log_value, 0, count - 1);
        end
    end
endmodule
