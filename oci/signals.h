/* Signals as `kill ID SIGNAL` names them: a number, or a name with or without "SIG". */
#ifndef COVE_OCI_SIGNALS_H
#define COVE_OCI_SIGNALS_H

/* Pure: the signal number (1..64), or -EINVAL. */
int oci_signal_parse(const char *s);

#endif
