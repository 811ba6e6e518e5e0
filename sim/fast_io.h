// The fast path's bulk file transfers under Verilator, called from sim/fast_actors.v with $c
// (included into the model's header by the testbench moe_hw/flows/fastsim.py generates).
//
// $fread and $fwrite "%u" move a word at a time: Verilator's $fread takes one locked fgetc
// per byte, its $fwrite builds a string a byte at a time for every call. At the seed scales
// (hundreds of MB of input and logs) that is most of a run. These do the same transfers with
// one fread or fwrite per array, and give the same bytes and the same return value:
//   fast_load: COUNT words of BYTES bytes, each big-endian, from an open file into ARRAY
//              (as $fread(ARRAY, fd, 0, COUNT)); returns the bytes read.
//   fast_dump: the first COUNT words of ARRAY (W bits each) into an open file, each word in
//              ceil(W / 32) 32-bit pieces, least significant first, each little-endian (as
//              one $fwrite(fd, "%u", ARRAY[i]) per word).
// Icarus Verilog runs the system tasks themselves (the same files, both directions).
#ifndef MOE_HW_FAST_IO_H
#define MOE_HW_FAST_IO_H

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "verilated.h"

// The model's set-up code, which calls these from its initial blocks, is compiled without
// optimisation (moe_hw/flows/sim_build.py); these loops move every byte of a run's inputs
// and logs, so they are optimised on their own.
#pragma GCC push_options
#pragma GCC optimize("O2")

namespace fast_io {

// One word's 32-bit pieces, least significant first: a scalar element's value, or a wide
// element's storage as it is.
template <typename T>
inline const EData* pieces(const T& element, EData (&scratch)[2]) {
    scratch[0] = static_cast<EData>(element);
    scratch[1] = static_cast<EData>(static_cast<uint64_t>(element) >> 32);
    return scratch;
}
template <std::size_t K>
inline const EData* pieces(const VlWide<K>& element, EData (&)[2]) {
    return element.data();
}

// An element set from a big-endian word of ``bytes`` bytes at ``first`` (the first byte the
// most significant), of which only the first ``have`` are there (a word cut short by the
// file's end: the rest are zero, as with $fread). Raw pointers in the byte loops: the helpers
// of the model's types (operator[], data()) are compiled with the unoptimised set-up code and
// are not inlined here, so each is called once per element, not once per byte.
inline void set_bytes(EData* words, int pieces, const uint8_t* first, int have, int bytes) {
    for (int k = 0; k < pieces; ++k) words[k] = 0;
    for (int index = 0; index < have; ++index) {
        const int byte = bytes - 1 - index;
        words[byte / 4] |= static_cast<EData>(first[index]) << (8 * (byte % 4));
    }
}
template <typename T>
inline void load(T& element, const uint8_t* first, int have, int bytes) {
    uint64_t value = 0;
    for (int index = 0; index < bytes; ++index)
        value = (value << 8) | (index < have ? first[index] : 0);
    element = static_cast<T>(value);
}
template <std::size_t K>
inline void load(VlWide<K>& element, const uint8_t* first, int have, int bytes) {
    set_bytes(element.data(), static_cast<int>(K), first, have, bytes);
}

}  // namespace fast_io

template <typename T, std::size_t N>
static uint64_t fast_load(IData fd, VlUnpacked<T, N>& array, uint64_t count, int bytes) {
    std::FILE* const file = VL_CVT_I_FP(fd);
    if (!file || count > N) return 0;
    std::vector<uint8_t> buffer(count * bytes);
    const std::size_t got = std::fread(buffer.data(), 1, buffer.size(), file);
    const uint8_t* const data = buffer.data();
    for (std::size_t word = 0; word * bytes < got; ++word) {
        const std::size_t from = word * bytes;
        const int have = static_cast<int>(std::min<std::size_t>(bytes, got - from));
        fast_io::load(array[word], data + from, have, bytes);
    }
    return got;
}

template <typename T, std::size_t N>
static void fast_dump(IData fd, const VlUnpacked<T, N>& array, uint64_t count, int width) {
    std::FILE* const file = VL_CVT_I_FP(fd);
    if (!file) return;
    const int per_word = (width + 31) / 32;
    std::vector<uint8_t> storage(1 << 20);                // written out whenever full
    uint8_t* const buffer = storage.data();
    const std::size_t size = storage.size();
    std::size_t used = 0;
    EData scratch[2];
    for (uint64_t word = 0; word < count && word < N; ++word) {
        if (used + 4 * per_word > size) {
            std::fwrite(buffer, 1, used, file);
            used = 0;
        }
        const EData* const piece = fast_io::pieces(array[word], scratch);
        for (int p = 0; p < per_word; ++p)
            for (int b = 0; b < 4; ++b) buffer[used++] = static_cast<uint8_t>(piece[p] >> (8 * b));
    }
    std::fwrite(buffer, 1, used, file);
}

#pragma GCC pop_options

#endif  // MOE_HW_FAST_IO_H
