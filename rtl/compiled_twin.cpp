// The compiled RTL twin: the accelerator's top level (insitu_accel, verilated) behind a C ABI
// that insitu.rtl.compiled loads with ctypes. Every clock cycle is stepped here, so that Python
// runs once per register access or per block of stream cycles, never once per cycle.
//
// The protocol mirrors insitu.fpga.pl.RTLModel (the Amaranth testbench) cycle for cycle, so both
// give the same CYCLES: one idle cycle before every request but the first (the Amaranth
// testbench ticks once while it waits for the next request), the same AXI-Lite handshakes, and
// the same per-cycle stream rules and stop conditions.

#include <cstdint>
#include <cstring>

#include "Vtop.h"
#include "verilated.h"


namespace {

struct Twin {
    VerilatedContext* context;
    Vtop* top;
    uint64_t cycles;     // clock cycles since the last reset
    uint64_t requests;   // requests served since the last reset
    bool low_pending;    // aclk was lowered and no eval has seen it yet
};

// The top's `interrupt` port: Verilator names the C++ member `interrupt` or, in versions that
// treat it as a reserved word, `__SYM__interrupt`; overload resolution picks whichever exists.
template <typename T>
auto interrupt_of(T* top, int) -> decltype(uint8_t(top->interrupt)) { return top->interrupt; }
template <typename T>
auto interrupt_of(T* top, long) -> decltype(uint8_t(top->__SYM__interrupt)) {
    return top->__SYM__interrupt;
}

// Settle the inputs set since the last eval (and the falling edge of the last tick).
inline void settle(Twin* t) {
    t->top->eval();
    t->low_pending = false;
}

// A rising edge. The falling edge is left to the next settle, which every cycle that sets
// inputs needs anyway (the design has no negedge logic): two evals per cycle, not three.
inline void tick(Twin* t) {
    if (t->low_pending) settle(t);  // an edge counts only if an eval saw the clock low
    t->top->aclk = 1;
    t->top->eval();
    t->top->aclk = 0;
    t->low_pending = true;
    t->cycles++;
}

// The Amaranth testbench waits one cycle between requests.
inline void gap(Twin* t) {
    if (t->requests++) tick(t);
}

void idle_inputs(Vtop* top) {
    top->s_axi_control_awvalid = 0;
    top->s_axi_control_wvalid = 0;
    top->s_axi_control_arvalid = 0;
    top->s_axi_control_bready = 1;   // held high, as the reference testbench does
    top->s_axi_control_rready = 1;
    top->s_axis_tvalid = 0;
    top->m_axis_tready = 0;
}

}  // namespace

extern "C" {

void twin_reset(void* handle) {
    Twin* t = static_cast<Twin*>(handle);
    idle_inputs(t->top);
    t->top->aresetn = 0;
    t->top->aclk = 0;
    settle(t);
    for (int i = 0; i < 2; i++) tick(t);
    t->top->aresetn = 1;
    settle(t);
    t->cycles = 0;
    t->requests = 0;
}

void* twin_create(void) {
    Twin* t = new Twin();
    t->context = new VerilatedContext;
    t->top = new Vtop{t->context};
    twin_reset(t);
    return t;
}

void twin_destroy(void* handle) {
    Twin* t = static_cast<Twin*>(handle);
    t->top->final();
    delete t->top;
    delete t->context;
    delete t;
}

uint64_t twin_cycles(void* handle) { return static_cast<Twin*>(handle)->cycles; }

void twin_idle(void* handle, uint64_t n) {
    Twin* t = static_cast<Twin*>(handle);
    for (uint64_t i = 0; i < n; i++) tick(t);
}

// An AXI-Lite write with full handshakes (AW and W together, then B).
void twin_write(void* handle, uint32_t offset, uint32_t value) {
    Twin* t = static_cast<Twin*>(handle);
    Vtop* top = t->top;
    gap(t);
    top->s_axi_control_awaddr = offset;
    top->s_axi_control_wdata = value;
    top->s_axi_control_wstrb = 0xF;
    top->s_axi_control_awvalid = 1;
    top->s_axi_control_wvalid = 1;
    settle(t);
    bool aw = false, w = false;
    while (!(aw && w)) {
        bool aw_now = top->s_axi_control_awready, w_now = top->s_axi_control_wready;
        tick(t);
        if (aw_now) { aw = true; top->s_axi_control_awvalid = 0; }
        if (w_now) { w = true; top->s_axi_control_wvalid = 0; }
        settle(t);
    }
    while (!top->s_axi_control_bvalid) { tick(t); settle(t); }
    tick(t);                          // the response handshake (bready is held high)
    settle(t);
}

// An AXI-Lite read with full handshakes (AR, then R).
uint32_t twin_read(void* handle, uint32_t offset) {
    Twin* t = static_cast<Twin*>(handle);
    Vtop* top = t->top;
    gap(t);
    top->s_axi_control_araddr = offset;
    top->s_axi_control_arvalid = 1;
    settle(t);
    while (!top->s_axi_control_arready) { tick(t); settle(t); }
    tick(t);
    top->s_axi_control_arvalid = 0;
    settle(t);
    while (!top->s_axi_control_rvalid) { tick(t); settle(t); }
    uint32_t data = top->s_axi_control_rdata;
    tick(t);
    settle(t);
    return data;
}

// Stream cycles while an op runs: beats from `in` (n_in beats of 8 16-bit words, TLAST on the
// last one when `last_at_end`) to `out` (room for `out_room` beats; `out_last[i]` is beat i's
// TLAST). Stops when the op has ended (interrupt), when the design waits for input there is
// none of, or for room there is none of, or after `max_cycles` cycles.
// result: [beats taken, beats given, op ended, cycles run].
void twin_stream(void* handle, const uint16_t* in, int64_t n_in, int last_at_end, uint16_t* out,
                 uint8_t* out_last, int64_t out_room, int64_t max_cycles, int64_t* result) {
    Twin* t = static_cast<Twin*>(handle);
    Vtop* top = t->top;
    gap(t);
    const uint64_t start = t->cycles;
    int64_t taken = 0, given = 0, ended = 0;
    bool closed = false;              // the output transfer ended on a TLAST beat
    for (int64_t i = 0; i < max_cycles; i++) {
        if (interrupt_of(top, 0)) { ended = 1; break; }
        const bool pending = taken < n_in;
        if (pending) {
            const uint16_t* w = in + 8 * taken;
            for (int k = 0; k < 4; k++)
                top->s_axis_tdata[k] = uint32_t(w[2 * k]) | (uint32_t(w[2 * k + 1]) << 16);
            top->s_axis_tlast = last_at_end && taken == n_in - 1;
        }
        const bool room = !closed && given < out_room;
        top->s_axis_tvalid = pending;
        top->m_axis_tready = room;
        settle(t);
        const bool took = pending && top->s_axis_tready;
        const bool gave = room && top->m_axis_tvalid;
        if (gave) {
            uint16_t* w = out + 8 * given;
            for (int k = 0; k < 4; k++) {
                const uint32_t d = top->m_axis_tdata[k];
                w[2 * k] = uint16_t(d);
                w[2 * k + 1] = uint16_t(d >> 16);
            }
            out_last[given] = top->m_axis_tlast;
            closed = top->m_axis_tlast;
            given++;
        }
        const bool starved = !pending && top->s_axis_tready;
        const bool blocked = !room && top->m_axis_tvalid;
        tick(t);
        if (took) taken++;
        if ((starved || blocked) && !(took || gave)) break;
    }
    top->s_axis_tvalid = 0;
    top->m_axis_tready = 0;
    settle(t);
    result[0] = taken;
    result[1] = given;
    result[2] = ended;
    result[3] = int64_t(t->cycles - start);
}

}  // extern "C"
