"""The microcontroller platform: the QEMU Cortex-M7 and unix-port twins, the serial link, flashing,
the training device protocol, and the experiments that need a board or a twin. The method it runs
(the graph, the training compiler, the simulator, the search) is :mod:`insitu.sparse`."""
