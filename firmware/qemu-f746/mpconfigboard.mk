# insitu's STM32F746-like board for MicroPython's QEMU port (QEMU machine mps2-an500, a Cortex-M7).
# Copied into ports/qemu/boards/INSITU_F746 by `insitu.mcu.qemu` (insitu mcu build-twin); built with
#   make -C ports/qemu BOARD=INSITU_F746
# What makes it an F746 rather than the stock MPS2_AN500 board: single-precision FPU and floats
# (the F746 has an FPv5-SP unit), the board's training heap (set at boot, see board.c), a FAT
# filesystem at /flash that survives resets, mounted at every (soft) reset like a board's flash.
QEMU_ARCH = arm
QEMU_MACHINE = mps2-an500

CFLAGS += -mthumb -mcpu=cortex-m7 -mfloat-abi=hard -mfpu=fpv5-sp-d16
CFLAGS += -DQEMU_SOC_MPS2
CFLAGS += -DMICROPY_HW_MCU_NAME='"Cortex-M7"'
# board.h declares the hook that mounts the filesystem after every mp_init().
CFLAGS += -include boards/INSITU_F746/board.h
# The FAT filesystem of /flash (no RTC: files get FatFs' fixed timestamp).
MICROPY_VFS_FAT = 1
CFLAGS += -DMICROPY_FATFS_ENABLE_LFN=1 -DMICROPY_FATFS_LFN_CODE_PAGE=437 -DMICROPY_FATFS_RPATH=2
CFLAGS += -DMICROPY_FATFS_NORTC=1 -DMICROPY_FATFS_MAX_SS=512

LDSCRIPT = mcu/arm/mps2.ld

SRC_C += boards/INSITU_F746/board.c shared/timeutils/timeutils.c   # FAT needs the date helpers
SRC_BOARD_O = shared/runtime/gchelper_native.o shared/runtime/gchelper_thumb2.o

MPY_CROSS_FLAGS += -march=armv7emsp

MICROPY_FLOAT_IMPL = float
SUPPORTS_HARDWARE_FP_SINGLE = 1

# The largest heap a twin can be given (insitu.mcu.qemu reads it from here); board.c shrinks it at
# boot to the heap QEMU's semihosting command line asks for (the board's 256 KiB by default).
MICROPY_HEAP_SIZE = 1048576
