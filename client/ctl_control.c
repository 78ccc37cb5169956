/* ctl_control.c: being written. */
