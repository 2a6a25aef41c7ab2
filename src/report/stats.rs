//! Unbiased estimators over a task's epochs: with `n` scored samples of which `c` passed,
//! pass@k is the chance that at least one of k samples passes, pass^k that all k do.

/// `1 - C(n-c, k) / C(n, k)`, computed as a product so it never overflows.
pub fn pass_at_k(n: u64, c: u64, k: u64) -> f64 {
    if k == 0 || n == 0 || k > n {
        return 0.0;
    }
    if n - c < k {
        return 1.0;
    }
    1.0 - ((n - c + 1)..=n).map(|i| 1.0 - k as f64 / i as f64).product::<f64>()
}

/// `C(c, k) / C(n, k)`.
pub fn pass_hat_k(n: u64, c: u64, k: u64) -> f64 {
    if k == 0 || n == 0 || k > n || c < k {
        return 0.0;
    }
    (0..k).map(|i| (c - i) as f64 / (n - i) as f64).product()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn pass_at_k_matches_the_combinatorial_definition() {
        // n = 5, c = 2, k = 2: 1 - C(3,2)/C(5,2) = 1 - 3/10.
        assert!(close(pass_at_k(5, 2, 2), 0.7));
        assert!(close(pass_at_k(5, 2, 1), 0.4), "pass@1 is c/n");
        assert!(close(pass_at_k(5, 0, 3), 0.0));
        assert!(close(pass_at_k(5, 3, 3), 1.0), "n - c < k: some pass is certain");
    }

    #[test]
    fn pass_hat_k_matches_the_combinatorial_definition() {
        // n = 5, c = 3, k = 2: C(3,2)/C(5,2) = 3/10.
        assert!(close(pass_hat_k(5, 3, 2), 0.3));
        assert!(close(pass_hat_k(4, 4, 4), 1.0));
        assert!(close(pass_hat_k(4, 3, 4), 0.0));
        assert!(close(pass_hat_k(5, 2, 1), 0.4), "pass^1 is c/n");
    }
}
