//! One of two futures, chosen when the call is made: what a call with two
//! arms returns is the chosen arm's future and nothing more. An `async fn`
//! over the two would keep its by-value arguments in its own state beside
//! the arm's future that holds them too (a write's buffer list, a tunnel's
//! request), under every open stream.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
};

use pin_project_lite::pin_project;

pin_project! {
    /// The future of the arm taken.
    #[project = EitherProj]
    pub enum Either<L, R> {
        /// The first arm (the common one, by convention).
        Left { #[pin] fut: L },
        /// The second arm.
        Right { #[pin] fut: R },
    }
}

impl<L: Future, R: Future<Output = L::Output>> Future for Either<L, R> {
    type Output = L::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            EitherProj::Left { fut } => fut.poll(cx),
            EitherProj::Right { fut } => fut.poll(cx),
        }
    }
}
