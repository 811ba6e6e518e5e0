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

#include <cstdint>
#include <cstdio>
#include <vector>

#include "verilated.h"

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

// Byte ``index`` (0: the least significant) of an element set to ``value``; the element is
// zero before its first byte.
template <typename T>
inline void set_byte(T& element, int index, uint8_t value) {
    element |= static_cast<T>(static_cast<uint64_t>(value) << (8 * index));
}
template <std::size_t K>
inline void set_byte(VlWide<K>& element, int index, uint8_t value) {
    element.data()[index / 4] |= static_cast<EData>(value) << (8 * (index % 4));
}
template <typename T>
inline void clear(T& element) { element = 0; }
template <std::size_t K>
inline void clear(VlWide<K>& element) {
    for (std::size_t k = 0; k < K; ++k) element.data()[k] = 0;
}

}  // namespace fast_io

template <typename T, std::size_t N>
static uint64_t fast_load(IData fd, VlUnpacked<T, N>& array, uint64_t count, int bytes) {
    std::FILE* const file = VL_CVT_I_FP(fd);
    if (!file || count > N) return 0;
    std::vector<uint8_t> buffer(count * bytes);
    const std::size_t got = std::fread(buffer.data(), 1, buffer.size(), file);
    for (std::size_t word = 0; word * bytes < got; ++word) {
        T& element = array[word];
        fast_io::clear(element);
        const uint8_t* const first = buffer.data() + word * bytes;
        for (int index = 0; index < bytes && word * bytes + index < got; ++index)
            fast_io::set_byte(element, bytes - 1 - index, first[index]);
    }
    return got;
}

template <typename T, std::size_t N>
static void fast_dump(IData fd, const VlUnpacked<T, N>& array, uint64_t count, int width) {
    std::FILE* const file = VL_CVT_I_FP(fd);
    if (!file) return;
    const int per_word = (width + 31) / 32;
    std::vector<uint8_t> buffer(1 << 20);                 // written out whenever full
    std::size_t used = 0;
    EData scratch[2];
    for (uint64_t word = 0; word < count && word < N; ++word) {
        if (used + 4 * per_word > buffer.size()) {
            std::fwrite(buffer.data(), 1, used, file);
            used = 0;
        }
        const EData* const piece = fast_io::pieces(array[word], scratch);
        for (int p = 0; p < per_word; ++p)
            for (int b = 0; b < 4; ++b) buffer[used++] = static_cast<uint8_t>(piece[p] >> (8 * b));
    }
    std::fwrite(buffer.data(), 1, used, file);
}

#endif  // MOE_HW_FAST_IO_H
