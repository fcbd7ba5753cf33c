/* The GPU kit's libicudata (scripts/gpu/pack.sh): an ICU common-data package with no entries,
   in the layout ICU's udata.cpp reads (a MappedData header, a UDataInfo naming the "ToCP"
   table-of-contents format, then an entry count of 0). libicuuc compiles in what kvlab's
   tokenizers use on the device (character properties, NFC/NFD, case mapping); NFKC/NFKD
   normalizers, which need the 31 MB data library, fail there with kvlab's "ICU could not load
   its data" message. Built with -DICU_DATA_SYMBOL=icudtNN_dat, NN the system ICU's version. */
#include <stdint.h>
struct data_info {
    uint16_t size, reserved_word;
    uint8_t is_big_endian, charset_family, sizeof_uchar, reserved_byte;
    uint8_t data_format[4], format_version[4], data_version[4];
};
struct stub_data {
    uint16_t header_size;
    uint8_t magic1, magic2;
    struct data_info info;
    uint8_t padding[8];
    uint32_t count, reserved;
    uint32_t toc[2];
};
#ifndef ICU_DATA_SYMBOL
#error "define ICU_DATA_SYMBOL, e.g. -DICU_DATA_SYMBOL=icudt72_dat"
#endif
__attribute__((visibility("default"))) const struct stub_data ICU_DATA_SYMBOL = {
    32, 0xda, 0x27,
    {sizeof(struct data_info), 0, 0, 0 /* ASCII family */, 2, 0, {'T', 'o', 'C', 'P'}, {1, 0, 0, 0}, {0, 0, 0, 0}},
    {0}, 0, 0, {0, 0}};
