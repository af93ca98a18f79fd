pub use redlock_macros::distributed_lock;
