// insitu's STM32F746-like QEMU board: included in every C file of the build (-include).
#ifndef INSITU_BOARD_H
#define INSITU_BOARD_H

// Runs at the end of every mp_init(): at power-on and after each soft reset.
void insitu_board_init(void);
#define MICROPY_PORT_INIT_FUNC insitu_board_init()

#endif
