// insitu's STM32F746-like board on QEMU's mps2-an500 (Cortex-M7): the parts a real F746 board has
// and the stock QEMU port lacks.
//
// - The training heap: the firmware is built with the largest heap a twin may have; at power-on
//   the heap is cut to the size QEMU's semihosting command line gives (`heap=BYTES`, default the
//   board's 256 KiB), laid out as gc_init() would lay out a heap of that many bytes. A twin of a
//   smaller or larger heap is then the same firmware, not a rebuild.
// - The flash: a FAT filesystem at /flash on a block device whose blocks live in a file on the
//   host (`insitu-flash.img` in QEMU's working directory, through semihosting file calls), so it
//   survives soft resets, hard resets and QEMU restarts like a board's flash. Mounted, and made
//   the working directory, after every mp_init(), as the stm32 port does with its flash.
#include <stdlib.h>
#include <string.h>

#include "py/gc.h"
#include "py/mperrno.h"
#include "py/mpstate.h"
#include "py/runtime.h"
#include "extmod/vfs.h"

#define DEFAULT_HEAP_BYTES (256 * 1024)
#define FLASH_IMAGE "insitu-flash.img"
#define BLOCK_BYTES (512)

// ARM semihosting operations (the "Semihosting for AArch32 and AArch64" specification).
#define SYS_OPEN (0x01)
#define SYS_WRITE (0x05)
#define SYS_READ (0x06)
#define SYS_SEEK (0x0a)
#define SYS_FLEN (0x0c)
#define SYS_GET_CMDLINE (0x15)
#define OPEN_MODE_READ_WRITE_BINARY (3)     // "r+b"

static int semihost(int op, void *args) {
    register int r0 __asm__ ("r0") = op;
    register void *r1 __asm__ ("r1") = args;
    __asm__ __volatile__ ("bkpt 0xAB" : "+r" (r0) : "r" (r1) : "memory");
    return r0;
}

static int flash_fd = -1;
static uint32_t flash_blocks;

// The value of `key=N` on the semihosting command line, or `otherwise`.
static size_t cmdline_value(const char *cmdline, const char *key, size_t otherwise) {
    size_t key_len = strlen(key);
    for (const char *p = cmdline; *p; ++p) {
        if ((p == cmdline || p[-1] == ' ') && strncmp(p, key, key_len) == 0 && p[key_len] == '=') {
            size_t value = 0;
            for (p += key_len + 1; *p >= '0' && *p <= '9'; ++p) {
                value = value * 10 + (size_t)(*p - '0');
            }
            return value;
        }
    }
    return otherwise;
}

// Shrink the heap set up by main()'s gc_init() over MICROPY_HEAP_SIZE bytes to what gc_init() over
// `bytes` would give: as many blocks, from the same start (the few objects mp_init() allocated so
// far sit at the start of the pool). The finaliser/weakref tables keep their larger size, unused.
static void limit_heap(size_t bytes) {
    mp_state_mem_area_t *area = &MP_STATE_MEM(area);
    size_t atb_bytes = (bytes - 1) * MP_BITS_PER_BYTE / (MP_BITS_PER_BYTE
        #if MICROPY_ENABLE_FINALISER
        + MP_BITS_PER_BYTE * 4 / 8
        #endif
        #if MICROPY_PY_WEAKREF
        + MP_BITS_PER_BYTE * 4 / 8
        #endif
        + MP_BITS_PER_BYTE * 4 * MICROPY_BYTES_PER_GC_BLOCK);
    if (atb_bytes >= area->gc_alloc_table_byte_len) {
        return;     // as large as the firmware's heap, or larger: keep it (the host checks this)
    }
    if (bytes < 4096 || area->gc_last_used_block >= atb_bytes * 4) {
        // Too small to even hold what mp_init() allocated: a board that cannot boot (QEMU exits).
        mp_printf(&mp_plat_print, "insitu board: a heap of %u bytes is too small to boot\n",
            (unsigned)bytes);
        exit(1);
    }
    area->gc_alloc_table_byte_len = atb_bytes;
    area->gc_pool_end = area->gc_pool_start + atb_bytes * 4 * MICROPY_BYTES_PER_GC_BLOCK;
    if (area->gc_last_free_atb_index >= atb_bytes) {
        area->gc_last_free_atb_index = 0;
    }
}

static void power_on(void) {
    static char cmdline[256];
    struct { char *buf; int len; } get = { cmdline, sizeof(cmdline) - 1 };
    if (semihost(SYS_GET_CMDLINE, &get) != 0) {
        get.len = 0;
    }
    cmdline[get.len] = '\0';
    limit_heap(cmdline_value(cmdline, "heap", DEFAULT_HEAP_BYTES));

    struct { const char *name; int mode; int len; } open = {
        FLASH_IMAGE, OPEN_MODE_READ_WRITE_BINARY, sizeof(FLASH_IMAGE) - 1
    };
    flash_fd = semihost(SYS_OPEN, &open);
    if (flash_fd >= 0) {
        struct { int fd; } flen = { flash_fd };
        int size = semihost(SYS_FLEN, &flen);
        flash_blocks = size > 0 ? (uint32_t)size / BLOCK_BYTES : 0;
    }
}

// ---- the flash block device (MicroPython's extended block protocol) ---------------------------

typedef struct {
    mp_obj_base_t base;
} flash_obj_t;

static void flash_transfer(int op, mp_obj_t block_in, mp_obj_t buf_in, mp_obj_t offset_in) {
    mp_buffer_info_t buf;
    mp_get_buffer_raise(buf_in, &buf, op == SYS_READ ? MP_BUFFER_WRITE : MP_BUFFER_READ);
    uint32_t at = mp_obj_get_int(block_in) * BLOCK_BYTES + mp_obj_get_int(offset_in);
    if (flash_fd < 0 || at + buf.len > flash_blocks * BLOCK_BYTES) {
        mp_raise_OSError(MP_EIO);
    }
    struct { int fd; int pos; } seek = { flash_fd, (int)at };
    struct { int fd; void *buf; int len; } io = { flash_fd, buf.buf, (int)buf.len };
    if (semihost(SYS_SEEK, &seek) != 0 || semihost(op, &io) != 0) {
        mp_raise_OSError(MP_EIO);      // SYS_READ/SYS_WRITE return the bytes *not* transferred
    }
}

static mp_obj_t flash_readblocks(size_t n_args, const mp_obj_t *args) {
    flash_transfer(SYS_READ, args[1], args[2], n_args > 3 ? args[3] : MP_OBJ_NEW_SMALL_INT(0));
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(flash_readblocks_obj, 3, 4, flash_readblocks);

static mp_obj_t flash_writeblocks(size_t n_args, const mp_obj_t *args) {
    flash_transfer(SYS_WRITE, args[1], args[2], n_args > 3 ? args[3] : MP_OBJ_NEW_SMALL_INT(0));
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(flash_writeblocks_obj, 3, 4, flash_writeblocks);

static mp_obj_t flash_ioctl(mp_obj_t self, mp_obj_t op_in, mp_obj_t arg_in) {
    switch (mp_obj_get_int(op_in)) {
        case MP_BLOCKDEV_IOCTL_INIT:
            return MP_OBJ_NEW_SMALL_INT(flash_fd < 0 ? -MP_EIO : 0);
        case MP_BLOCKDEV_IOCTL_BLOCK_COUNT:
            return MP_OBJ_NEW_SMALL_INT(flash_blocks);
        case MP_BLOCKDEV_IOCTL_BLOCK_SIZE:
            return MP_OBJ_NEW_SMALL_INT(BLOCK_BYTES);
        case MP_BLOCKDEV_IOCTL_DEINIT:
        case MP_BLOCKDEV_IOCTL_SYNC:
        case MP_BLOCKDEV_IOCTL_BLOCK_ERASE:
            return MP_OBJ_NEW_SMALL_INT(0);
        default:
            return mp_const_none;
    }
}
static MP_DEFINE_CONST_FUN_OBJ_3(flash_ioctl_obj, flash_ioctl);

static const mp_rom_map_elem_t flash_locals_dict_table[] = {
    { MP_ROM_QSTR(MP_QSTR_readblocks), MP_ROM_PTR(&flash_readblocks_obj) },
    { MP_ROM_QSTR(MP_QSTR_writeblocks), MP_ROM_PTR(&flash_writeblocks_obj) },
    { MP_ROM_QSTR(MP_QSTR_ioctl), MP_ROM_PTR(&flash_ioctl_obj) },
};
static MP_DEFINE_CONST_DICT(flash_locals_dict, flash_locals_dict_table);

static MP_DEFINE_CONST_OBJ_TYPE(
    flash_type,
    MP_QSTR_Flash,
    MP_TYPE_FLAG_NONE,
    locals_dict, &flash_locals_dict
    );

static const flash_obj_t flash_obj = { { &flash_type } };

// ---- every mp_init() ---------------------------------------------------------------------------

void insitu_board_init(void) {
    static bool powered_on = false;
    if (!powered_on) {
        powered_on = true;
        power_on();
    }
    // vfs.mount(flash, '/flash', mkfs=True); os.chdir('/flash'); sys.path.append('/flash/lib')
    nlr_buf_t nlr;
    if (nlr_push(&nlr) == 0) {
        mp_obj_t mount_args[4] = {
            MP_OBJ_FROM_PTR(&flash_obj), mp_obj_new_str("/flash", 6),
            MP_OBJ_NEW_QSTR(MP_QSTR_mkfs), mp_const_true,
        };
        mp_call_function_n_kw(MP_OBJ_FROM_PTR(&mp_vfs_mount_obj), 2, 1, mount_args);
        mp_vfs_chdir(mount_args[1]);
        mp_obj_list_append(mp_sys_path, mp_obj_new_str("/flash/lib", 10));
        nlr_pop();
    } else {
        mp_printf(&mp_plat_print, "insitu board: no /flash filesystem: ");
        mp_obj_print_exception(&mp_plat_print, MP_OBJ_FROM_PTR(nlr.ret_val));
    }
}
