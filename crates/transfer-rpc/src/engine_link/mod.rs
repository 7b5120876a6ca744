//! Server side of the ENGINE_* extension: stage boundaries written
//! server-to-server over a TransferEngine (being built).
